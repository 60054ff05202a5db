#!/usr/bin/env python3
"""Keeps code shown in Markdown identical to compiled sources.

    snippets.py [--check] FILE.md...

A Markdown file marks a snippet as

    <!-- snippet: path/to/source.cc name -->
    ```cpp
    (filled in by this tool)
    ```
    <!-- /snippet -->

and the source marks the lines to show between `// [snippet:name]` and
`// [/snippet:name]` (or a region of a solution, between the comment lines
`// BEGIN SOLUTION` and `// END SOLUTION` that follow `// [snippet:name]`).
Paths are relative to the repository root. Without --check the Markdown is
rewritten; with --check it exits 1 and names each stale snippet, so the
test suite fails when prose drifts from code.
"""
import os
import re
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"(<!-- snippet: (\S+) (\S+) -->\n)(.*?)(<!-- /snippet -->)", re.S)


def extract(path, name):
    lines = open(os.path.join(ROOT, path)).read().splitlines()
    begin = f"// [snippet:{name}]"
    end = f"// [/snippet:{name}]"
    try:
        i = next(k for k, l in enumerate(lines) if l.strip() == begin)
        j = next(k for k, l in enumerate(lines) if l.strip() == end and k > i)
    except StopIteration:
        sys.exit(f"snippets: {path} has no '{begin}' ... '{end}' region")
    body = [l for l in lines[i + 1:j] if l.strip() not in ("// BEGIN SOLUTION", "// END SOLUTION")]
    return textwrap.dedent("\n".join(body)).strip("\n")


def render(text):
    def fill(m):
        code = extract(m.group(2), m.group(3))
        lang = "cpp" if m.group(2).endswith((".cc", ".h")) else ""
        return f"{m.group(1)}```{lang}\n{code}\n```\n{m.group(5)}"
    return BLOCK.sub(fill, text)


def main(argv):
    check = "--check" in argv
    files = [a for a in argv if a != "--check"]
    stale = []
    for md in files:
        text = open(md).read()
        new = render(text)
        if new != text:
            if check:
                stale.append(md)
            else:
                open(md, "w").write(new)
    if stale:
        print("code snippets out of date in: " + ", ".join(stale) + "; run tools/snippets.py " + " ".join(stale))
        return 1
    if check:
        print(f"snippets up to date in {len(files)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
