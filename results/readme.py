"""Regenerate the column table of ``results/README.md`` from ``results.schema`` (the one source).

    python -m results.readme          # rewrites the part between the schema markers
"""

from __future__ import annotations

from pathlib import Path

from results.schema import markdown_table

__all__ = ["main"]

README = Path(__file__).with_name("README.md")
BEGIN, END = "<!-- schema:begin (python -m results.readme) -->", "<!-- schema:end -->"


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m results.readme",
                            description=__doc__.splitlines()[0]).parse_args(argv)
    text = README.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    README.write_text(f"{head}{BEGIN}\n{markdown_table()}\n{END}{tail}")
    print(f"wrote the schema table of {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
