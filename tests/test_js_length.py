"""JavaScript's lengths (pi-sessions.md §2.2): JS ``.length`` counts UTF-16 code units, so an astral
character such as an emoji counts 2; ``JSON.stringify`` is compact, keeps non-ASCII raw, prints
integral floats without ``.0`` and escapes controls and lone surrogates. Every expected number is
worked out by hand in the comment next to it.
"""

from __future__ import annotations

import math

import pytest

from om_core.pi.js_length import js_json_length, js_len, js_number


# ------------------------------------------------------------------ js_len (UTF-16 code units)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", 0),
        ("abc", 3),
        ("é", 1),  # U+00E9 is in the BMP: one code unit
        ("漢字", 2),  # two BMP characters
        ("😀", 2),  # U+1F600 is astral: a surrogate pair, 2 code units
        ("𝄞", 2),  # U+1D11E, astral
        ("naïve 😀 ok", 11),  # n,a,ï,v,e (5) + space (1) + 😀 (2) + space (1) + o,k (2) = 11
        ("\ud800", 1),  # a lone surrogate is one code unit
    ],
)
def test_js_len_counts_utf16_code_units(value, expected):
    assert js_len(value) == expected


# ------------------------------------------------------------------ js_number (Number#toString)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1"),  # integral float: no ".0" in JS
        (100.0, "100"),
        (-2.5, "-2.5"),
        (0.1, "0.1"),
        (-0.0, "0"),  # JSON.stringify(-0) === "0"
        (0.1 + 0.2, "0.30000000000000004"),  # shortest round-trip digits
        (1e20, "100000000000000000000"),  # exponent 20 < 21: written out
        (123456789012345680000.0, "123456789012345680000"),
        (1e21, "1e+21"),  # exponent >= 21: exponent form with an explicit "+"
        (2.5e21, "2.5e+21"),
        (1.5e300, "1.5e+300"),
        (1e-6, "0.000001"),  # exponent -6 is still written out
        (1e-7, "1e-7"),  # exponent <= -7: exponent form, no zero padding ("1e-07" in Python)
        (1.5e-7, "1.5e-7"),
        (5e-324, "5e-324"),
        (math.nan, "null"),  # JSON.stringify(NaN) === "null"
        (math.inf, "null"),
        (-math.inf, "null"),
    ],
)
def test_js_number_formats_like_javascript(value, expected):
    assert js_number(value) == expected


# ------------------------------------------------------------------ js_json_length (JSON.stringify(x).length)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 4),  # null
        (True, 4),  # true
        (False, 5),  # false
        (0, 1),
        (-12, 3),
        (1.0, 1),  # "1"
        (1e21, 5),  # "1e+21"
        (1e-7, 4),  # "1e-7"
        (10**21, 5),  # a huge integer is a double in JS: "1e+21"
        (2**53 + 1, 16),  # JSON.parse rounds it to 9007199254740992 (16 digits)
        ([], 2),
        ({}, 2),
        ("", 2),  # ""
        ("é", 3),  # raw Unicode, not \u00e9: 1 + 2 quotes
        ("😀", 4),  # 2 code units + 2 quotes
        ('a"b', 6),  # "a\"b": 3 chars + 1 backslash + 2 quotes
        ("a\\b", 6),  # "a\\b": 3 chars + 1 backslash + 2 quotes
        ("line\nbreak", 13),  # 10 chars + 1 (\n) + 2 quotes
        ("\t\b\f\r", 10),  # 4 short escapes: 4*2 + 2 quotes
        ("\x01", 8),  # "\u0001": 6 + 2 quotes
        ("\x7f", 3),  # DEL is not escaped: 1 + 2 quotes
        ("\u2028", 3),  # LINE SEPARATOR is not escaped by JSON.stringify: 1 + 2 quotes
        ("\ud800", 8),  # lone surrogate becomes "\ud800": 6 + 2 quotes
        (["a", "😀", True], 15),  # ["a","😀",true]: 2 brackets + 3 + 4 + 4 + 2 commas
        ({"ключ": "значение"}, 19),  # {"ключ":"значение"}: 2 braces + 6 + 1 colon + 10
        # {"k":null,"t":true,"f":false,"e":[],"o":{}}: 2 braces + 4 commas
        #   + (3+1+4) + (3+1+4) + (3+1+5) + (3+1+2) + (3+1+2) = 6 + 37 = 43
        ({"k": None, "t": True, "f": False, "e": [], "o": {}}, 43),
    ],
)
def test_js_json_length_matches_json_stringify(value, expected):
    assert js_json_length(value) == expected


def test_js_json_length_objects_nested_in_arrays_and_js_number_layout():
    # {"items":[{"n":1},{"n":1e+21}],"e":1e-7}
    #   braces 2 + "items" 7 + colon 1
    #   + array: brackets 2 + {"n":1} (2+3+1+1=7) + comma 1 + {"n":1e+21} (2+3+1+5=11) = 21
    #   + comma 1 + "e" 3 + colon 1 + 1e-7 (4)  = 2+7+1+21+1+3+1+4 = 40
    value = {"items": [{"n": 1.0}, {"n": 1e21}], "e": 1e-7}
    assert js_json_length(value) == 40


def test_js_json_length_deeply_nested():
    # {"nested":{"list":[1,[2,[3]],{"deep":{"x":null}}]}}
    #   outer braces 2 + "nested" 8 + colon 1
    #   + inner braces 2 + "list" 6 + colon 1
    #   + [1,[2,[3]],{"deep":{"x":null}}]: brackets 2 + "1" 1 + [2,[3]] 7 + {"deep":{"x":null}} 19 + 2 commas = 31
    #   = 2+8+1+2+6+1+31 = 51
    value = {"nested": {"list": [1, [2, [3]], {"deep": {"x": None}}]}}
    assert js_json_length(value) == 51


def test_js_json_length_escapes_quotes_newlines_controls_and_lone_surrogates():
    # {"q":"say \"hi\"\n","c":"\u0000\u001f","s":"a\ud83d","t":"\udc00b"}
    #   q: key 3 + colon 1 + value (9 chars + 3 escape backslashes + 2 quotes = 14) = 18
    #   c: key 3 + colon 1 + value (2 controls * 6 + 2 quotes = 14)                 = 18
    #   s: key 3 + colon 1 + value ("a" 1 + lone high surrogate 6 + 2 quotes = 9)    = 13
    #   t: key 3 + colon 1 + value (lone low surrogate 6 + "b" 1 + 2 quotes = 9)     = 13
    #   = 62 + 3 commas + 2 braces = 67
    value = {"q": 'say "hi"\n', "c": "\x00\x1f", "s": "a\ud83d", "t": "\udc00b"}
    assert js_json_length(value) == 67
