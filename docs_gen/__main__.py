"""``python -m docs_gen`` writes the generated pages; ``--check`` exits 1 naming each page that drifted."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from docs_gen.pages import generate

DOCS = Path(__file__).resolve().parent.parent / "docs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs_gen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare with docs/ instead of writing")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the docs folder (default: the project's)")
    args = parser.parse_args(argv)
    drifted = []
    for relative, text in generate().items():
        path = args.docs / relative
        if args.check:
            if not path.is_file() or path.read_text() != text:
                drifted.append(relative)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.is_file() or path.read_text() != text:
                path.write_text(text)
                print(f"wrote docs/{relative}")
    if drifted:
        print("generated pages out of date (run `make docs-gen`): " + ", ".join(f"docs/{p}" for p in drifted),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
