"""Regenerate the column table of ``results/README.md`` from ``results.schema`` (the one source).

    python -m results.readme          # rewrites the part between the schema markers
"""

from __future__ import annotations

import sys
from pathlib import Path

from results.schema import markdown_table

__all__ = ["main"]

README = Path(__file__).with_name("README.md")
BEGIN, END = "<!-- schema:begin (python -m results.readme) -->", "<!-- schema:end -->"


def with_table(text: str) -> str:
    """``text`` with the part between its schema markers replaced by the current table; a text
    without each marker once, in order, is refused (a missing end marker dropped everything
    after the table, a missing begin marker appended a second table)."""
    counts = (text.count(BEGIN), text.count(END))
    if counts != (1, 1) or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{README}: expected the markers {BEGIN!r} and {END!r} once each, in "
                         f"that order (found {counts[0]} and {counts[1]}); put them back around "
                         "the column table")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown_table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m results.readme",
                            description=__doc__.splitlines()[0]).parse_args(argv)
    try:
        text = with_table(README.read_text())
    except ValueError as e:
        print(f"results.readme: {e}", file=sys.stderr)
        return 2
    README.write_text(text)
    print(f"wrote the schema table of {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
