"""Pi's token estimate (pi-sessions.md §2.2) and the offline tiktoken count (SPEC §12).

Every expected number is worked out by hand in the comment next to it. JS ``.length`` counts UTF-16
code units, so an astral character such as an emoji counts 2; ``JSON.stringify`` is compact, keeps
non-ASCII raw, prints integral floats without ``.0`` and escapes controls and lone surrogates.
"""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from om_core.pi import tokens
from om_core.pi.js_length import js_len
from om_core.pi.tokens import (
    IMAGE_CHARS,
    TokenizerUnavailable,
    count_text_tokens,
    count_tokens,
    estimate_message_chars,
    estimate_message_tokens,
    message_text_pieces,
)

IMAGE = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def assistant(*blocks: dict, **extra) -> dict:
    return {"role": "assistant", "content": list(blocks), "stopReason": "stop", **extra}


def tool_call(name: str, arguments) -> dict:
    return {"type": "toolCall", "id": "call_1", "name": name, "arguments": arguments}


# ------------------------------------------------------------------ estimate: rounding


@pytest.mark.parametrize(
    ("chars", "expected_tokens"),
    [(0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3)],  # ceil(chars / 4)
)
def test_estimate_rounds_chars_over_four_up(chars, expected_tokens):
    message = {"role": "user", "content": "x" * chars}
    assert estimate_message_chars(message) == chars
    assert estimate_message_tokens(message) == expected_tokens


# ------------------------------------------------------------------ estimate: user


def test_user_string_content_counts_its_length():
    assert estimate_message_chars({"role": "user", "content": "hello"}) == 5


def test_user_non_bmp_text_counts_utf16_units():
    message = {"role": "user", "content": [text("😀😀a")]}
    # 2 + 2 + 1 = 5 code units -> ceil(5/4) = 2 (counting code points would give 3 -> 1)
    assert estimate_message_chars(message) == 5
    assert estimate_message_tokens(message) == 2


def test_user_images_count_zero_under_legacy_rules():
    message = {"role": "user", "content": [text("abcd"), IMAGE, text("ef")]}
    # 4 + 0 (image) + 2 = 6 -> ceil(6/4) = 2
    assert estimate_message_chars(message, "legacy") == 6
    assert estimate_message_tokens(message, "legacy") == 2


def test_user_image_only_is_zero_under_legacy_rules():
    assert estimate_message_tokens({"role": "user", "content": [IMAGE]}, "legacy") == 0


def test_user_images_count_1200_tokens_each_under_pi_16():
    message = {"role": "user", "content": [text("abcd"), IMAGE, text("ef"), IMAGE]}
    # 4 + 4800 + 2 + 4800 = 9606 -> ceil(9606/4) = 2402
    assert estimate_message_chars(message) == 9606
    assert estimate_message_tokens(message) == 2402
    assert estimate_message_tokens({"role": "user", "content": [IMAGE]}) == 1200


def test_system_message_counts_content_sections_and_tools_under_pi_16():
    message = {"role": "system", "content": "You are Pi.", "sections": {"preamble": "Be brief.", "docs": None},
               "toolsAdded": [{"name": "read"}], "toolsRemoved": [{"name": "bash"}]}
    # 11 (content) + 9 (the section with text; Pi skips a null one) + 17 (JSON [{"name":"read"}], what
    # Pi's estimateTokens counts of the tools: toolsAdded only) = 37 -> 10 tokens
    assert estimate_message_chars(message) == 37
    assert estimate_message_tokens(message) == 10
    assert estimate_message_tokens(message, "legacy") == 0


# ------------------------------------------------------------------ estimate: custom and toolResult


def test_image_chars_constant_is_4800():
    assert IMAGE_CHARS == 4800  # 1200 tokens per image (the source comment's 4000 is wrong)


def test_tool_result_image_adds_4800_chars():
    message = {"role": "toolResult", "toolCallId": "c", "toolName": "read", "content": [text("abc"), IMAGE],
               "isError": False}
    # 3 + 4800 = 4803 -> ceil(4803/4) = 1201
    assert estimate_message_chars(message) == 4803
    assert estimate_message_tokens(message) == 1201


def test_custom_images_add_4800_chars_each():
    message = {"role": "custom", "customType": "x", "content": [IMAGE, text("ab"), IMAGE], "display": True}
    # 4800 + 2 + 4800 = 9602 -> ceil(9602/4) = 2401
    assert estimate_message_chars(message) == 9602
    assert estimate_message_tokens(message) == 2401


def test_custom_string_content_counts_its_length():
    message = {"role": "custom", "customType": "x", "content": "abcdefgh", "display": False}
    assert estimate_message_chars(message) == 8  # -> 2 tokens
    assert estimate_message_tokens(message) == 2


# ------------------------------------------------------------------ estimate: assistant


def test_aborted_assistant_with_empty_content_is_zero():
    message = assistant(stopReason="aborted", errorMessage="Request was aborted.",
                        usage={"input": 500, "output": 30, "cacheRead": 0, "cacheWrite": 0})
    assert estimate_message_chars(message) == 0
    assert estimate_message_tokens(message) == 0


def test_assistant_text_thinking_and_tool_call_without_signatures():
    message = assistant(
        {"type": "thinking", "thinking": "hmm", "thinkingSignature": "S" * 1000},
        {"type": "text", "text": "Hi", "textSignature": "T" * 500},
        tool_call("read", {"path": "é/😀.txt"}),
    )
    # thinking "hmm" 3 + text "Hi" 2 + name "read" 4
    # + {"path":"é/😀.txt"}: braces 2 + "path" 6 + colon 1 + ("é/😀.txt" = 1+1+2+4 = 8, quoted 10) = 19
    # = 3 + 2 + 4 + 19 = 28 -> 7 tokens; the 1500 signature chars are not counted
    assert estimate_message_chars(message) == 28
    assert estimate_message_tokens(message) == 7


def test_redacted_thinking_counts_only_its_thinking_string():
    message = assistant({"type": "thinking", "thinking": "abc", "redacted": True, "thinkingSignature": "Z" * 99})
    assert estimate_message_chars(message) == 3


def test_tool_call_arguments_with_nested_values_and_js_numbers():
    message = assistant(tool_call("edit", {"items": [{"n": 1.0}, {"n": 1e21}], "e": 1e-7}))
    # "edit" 4 + {"items":[{"n":1},{"n":1e+21}],"e":1e-7} 40 (see test above) = 44 -> 11 tokens
    assert estimate_message_chars(message) == 44
    assert estimate_message_tokens(message) == 11


def test_tool_call_arguments_with_escapes_and_lone_surrogates():
    message = assistant(tool_call("bash", {"q": 'say "hi"\n', "c": "\x00\x1f", "s": "a\ud83d", "t": "\udc00b"}))
    # "bash" 4 + 67 (see test_js_json_length_escapes_...) = 71 -> ceil(71/4) = 18
    assert estimate_message_chars(message) == 71
    assert estimate_message_tokens(message) == 18


def test_tool_call_arguments_non_ascii_kept_raw():
    message = assistant(tool_call("write", {"ключ": "значение"}))
    # "write" 5 + {"ключ":"значение"} 19 = 24 (escaped \uXXXX would give far more) -> 6 tokens
    assert estimate_message_chars(message) == 24
    assert estimate_message_tokens(message) == 6


def test_several_tool_calls_add_up():
    message = assistant(tool_call("a", {}), tool_call("bb", []), tool_call("c", None))
    # (1 + "{}" 2) + (2 + "[]" 2) + (1 + "null" 4) = 3 + 4 + 5 = 12 -> 3 tokens
    assert estimate_message_chars(message) == 12
    assert estimate_message_tokens(message) == 3


def test_assistant_images_are_not_counted():
    message = assistant(text("ab"), IMAGE)
    assert estimate_message_chars(message) == 2  # an image block is no assistant block type Pi counts


# ------------------------------------------------------------------ estimate: other roles


def test_bash_execution_counts_command_plus_output():
    message = {"role": "bashExecution", "command": "ls -la", "output": "a\nb😀", "exitCode": 0,
               "cancelled": False, "truncated": False}
    # "ls -la" 6 + "a\nb😀" (1+1+1+2 = 5) = 11 -> 3 tokens
    assert estimate_message_chars(message) == 11
    assert estimate_message_tokens(message) == 3


def test_bash_execution_counted_even_when_excluded_from_context():
    message = {"role": "bashExecution", "command": "ls", "output": "abc", "excludeFromContext": True}
    assert estimate_message_chars(message) == 5  # 2 + 3


def test_branch_summary_counts_summary_only():
    message = {"role": "branchSummary", "summary": "abcde", "fromId": "deadbeef-long-id"}
    assert estimate_message_chars(message) == 5  # -> 2 tokens
    assert estimate_message_tokens(message) == 2


def test_compaction_summary_counts_summary_only():
    message = {"role": "compactionSummary", "summary": "x" * 9, "tokensBefore": 123456}
    assert estimate_message_chars(message) == 9  # -> ceil(9/4) = 3
    assert estimate_message_tokens(message) == 3


@pytest.mark.parametrize(
    "message",
    [
        {"role": "system", "content": "You are Pi, a coding agent.", "sections": {"preamble": "You are Pi."}},
        {"role": "system", "content": [text("You are Pi.")], "sections": {}},
        {"role": "hookMessage", "content": "raw v1 hook message"},  # only counted after migration to custom
        {"role": "narrator", "content": "something"},
        {"content": "no role at all"},
    ],
    ids=["system-string", "system-blocks", "hookMessage", "unknown-role", "no-role"],
)
def test_system_and_unknown_roles_count_zero(message):
    assert estimate_message_chars(message, "legacy") == 0
    assert estimate_message_tokens(message, "legacy") == 0
    if message.get("role") != "system":  # Pi 1.6 counts only the system prompt among these
        assert estimate_message_tokens(message) == 0


# ------------------------------------------------------------------ text pieces for the real tokenizer


def test_text_pieces_user_skip_images_and_empty_text():
    message = {"role": "user", "content": [text("hello"), IMAGE, text(""), text("world")]}
    assert message_text_pieces(message) == ["hello", "world"]


def test_text_pieces_user_string():
    assert message_text_pieces({"role": "user", "content": "hi"}) == ["hi"]


def test_text_pieces_assistant_blocks_with_compact_raw_unicode_arguments():
    message = assistant(
        {"type": "thinking", "thinking": "hmm", "thinkingSignature": "S"},
        text("Hi"),
        tool_call("read", {"path": "é/😀.txt", "limit": 5}),
    )
    assert message_text_pieces(message) == ["hmm", "Hi", 'read{"path":"é/😀.txt","limit":5}']


def test_text_pieces_tool_result_excludes_images():
    message = {"role": "toolResult", "content": [text("out"), IMAGE]}
    assert message_text_pieces(message) == ["out"]


def test_text_pieces_bash_summary_and_system():
    assert message_text_pieces({"role": "bashExecution", "command": "ls", "output": "a"}) == ["lsa"]
    assert message_text_pieces({"role": "branchSummary", "summary": "s"}) == ["s"]
    assert message_text_pieces({"role": "compactionSummary", "summary": "c"}) == ["c"]
    assert message_text_pieces({"role": "system", "content": "You are Pi."}) == []
    assert message_text_pieces(assistant()) == []  # aborted, empty content


def test_text_pieces_measure_the_same_chars_as_the_estimate_without_images():
    message = assistant(
        {"type": "thinking", "thinking": "think 😀"},
        text("naïve"),
        tool_call("edit", {"path": "a.py", "edits": [{"old": "x", "new": "y\n"}], "n": 3}),
    )
    assert sum(js_len(p) for p in message_text_pieces(message)) == estimate_message_chars(message)


# ------------------------------------------------------------------ tiktoken o200k_base, offline


def test_count_tokens_o200k_base():
    # o200k_base: "hello world" -> ["hello", " world"] = 2; "Hello, world!" -> ["Hello", ",", " world", "!"] = 4
    assert count_tokens(["hello world", "Hello, world!"]) == [2, 4]


def test_count_tokens_single_thread_and_empty_inputs():
    assert count_tokens(["a", "a", "a"], threads=1) == [1, 1, 1]
    assert count_tokens([]) == []
    assert count_tokens([""]) == [0]


def test_count_text_tokens():
    assert count_text_tokens("hello world") == 2
    assert count_text_tokens("") == 0


def test_count_tokens_tolerates_lone_surrogates():
    assert count_tokens(["x\ud800y"])[0] >= 1


def test_encoding_loads_without_network(monkeypatch):
    import tiktoken.registry

    monkeypatch.setattr(tokens, "_encodings", {})  # force a fresh load from the files on disk
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})

    def no_network(*args, **kwargs):
        raise AssertionError("the tokenizer tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    assert count_tokens(["hello world"]) == [2]


def test_missing_encoding_file_raises_instead_of_downloading(monkeypatch, tmp_path):
    monkeypatch.setattr(tokens, "_encodings", {})
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # an empty cache directory
    with pytest.raises(TokenizerUnavailable, match="not found"):
        count_tokens(["hello"])


def test_unknown_encoding_raises():
    with pytest.raises(TokenizerUnavailable, match="unknown tiktoken encoding"):
        count_tokens(["hello"], encoding="no_such_encoding")


# ---------------------------------------------------------------- bounded run count


def exact_counts(texts: list[str]) -> list[int]:
    enc = tokens.get_encoding()
    return [len(enc.encode_ordinary(t)) for t in texts]


def long_runs() -> dict[str, str]:
    import base64
    import hashlib
    import json

    blob = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(2000))
    minified = json.dumps([{"id": i, "name": f"item{i}", "tags": ["a", "b"], "ok": True} for i in range(600)],
                          separators=(",", ":"))
    letters = "".join("abcdefghijklmnopqrstuvwxyz"[b % 26] for b in blob[:30_000])
    return {
        "one char": "log: " + "a" * 40_000 + " end",
        "letters": "run " + letters + " done",
        "punctuation": "=" * 20_000 + "\nEOF",
        "spaces": "indent" + " " * 10_000 + "x",
        # not one pre-token piece: counted exactly, on the fast path
        "base64": "payload " + base64.b64encode(blob).decode() + "\nthat was it",
        "minified json": "response: " + minified,
        "hex": "sha " + blob.hex()[:30_000],
    }


def test_long_runs_are_counted_in_bounded_pieces_and_identical_pieces_once():
    seen: list[str] = []

    def fake_count(texts):
        seen.extend(texts)
        return [len(t) for t in texts]

    bounded = tokens._bounded_counter(fake_count)
    text = "head " + "a" * 5_000 + " tail"
    assert bounded([text, "short text"]) == [len(text), len("short text")]
    assert max(map(len, seen)) <= tokens.RUN_PIECE_CHARS + len(" tail")
    assert seen.count("a" * tokens.RUN_PIECE_CHARS) == 1  # counted once, used 19 times
    seen.clear()
    normal = "word " * 2_000  # long, but no run over LONG_RUN_CHARS: counted whole
    assert bounded([normal]) == [len(normal)] and seen == [normal]


def test_count_tokens_uses_the_bounded_count_for_long_runs(monkeypatch):
    calls: list[list[str]] = []
    real = tokens._make_counter

    def recording(enc):
        inner = real(enc)

        def count(texts):
            calls.append(list(texts))
            return inner(texts)
        return count

    monkeypatch.setattr(tokens, "_make_counter", recording)
    monkeypatch.setattr(tokens, "_counters", {})
    count_tokens(["x" * 100_000], threads=1)
    assert calls and max(len(t) for batch in calls for t in batch) <= tokens.RUN_PIECE_CHARS


def test_bounded_count_stays_close_to_the_exact_count():
    runs = long_runs()
    bounded = count_tokens(list(runs.values()), threads=1)
    for (name, text), got, exact in zip(runs.items(), bounded, exact_counts(list(runs.values()))):
        if name in ("base64", "minified json", "hex"):
            assert tokens.bounded_pieces(text) is None and got == exact, name
        else:
            assert tokens.bounded_pieces(text) is not None, name
            assert abs(got - exact) <= max(3, 0.01 * exact), (name, got, exact)


def test_normal_text_is_counted_exactly():
    prose = ("The retry policy backs off exponentially; see https://example.com/docs/retry?page=2 and "
             "src/om_core/pi/tokens.py:412 for details. ") * 300
    code = "def handler(request):\n    return {'status': 200, 'body': request.json()}\n" * 200
    texts = [prose, code, "naïve café 😀 " * 500, "x\ud800y " * 10]
    assert all(tokens.bounded_pieces(t) is None for t in texts)
    assert count_tokens(texts, threads=1) == [len(tokens.get_encoding().encode_ordinary(
        tokens._scrub_surrogates(t))) for t in texts]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab é½_-.1 \n\t\u2003"), st.integers(1, 1_400)), min_size=1, max_size=8))
def test_the_long_run_pre_check_skips_only_texts_without_a_long_run(runs):
    """bounded_pieces' cheap pre-check gives what the regex scan alone gives, for texts made of
    runs of letters, digits, punctuation and whitespace of every kind and length around LONG_RUN_CHARS."""
    text = "".join(char * n for char, n in runs)
    scanned = None
    if len(text) > tokens.LONG_RUN_CHARS:  # the scan alone: the pre-check as if every text failed it
        real = tokens._may_hold_a_long_run
        tokens._may_hold_a_long_run = lambda _text: True
        try:
            scanned = tokens.bounded_pieces(text)
        finally:
            tokens._may_hold_a_long_run = real
    assert tokens.bounded_pieces(text) == scanned


@pytest.mark.real_sessions
def test_sample_session_counts_are_unchanged_by_the_bounded_count(large_session):
    import json

    pieces = []
    for line in large_session.read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        if obj.get("type") == "message":
            pieces.extend(message_text_pieces(obj["message"]))
    plain = tokens._make_counter(tokens.get_encoding())
    assert sum(count_tokens(pieces, threads=1)) == pytest.approx(sum(plain(pieces)), rel=0.001)
