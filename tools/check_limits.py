#!/usr/bin/env python3
"""check_limits.py: the size limits of the code outside tests/ (docs/architecture.md).

No C source or header over 1,200 lines; no function over 120 lines, counted from the line
that names it to its closing brace. Functions are found as the code is formatted here
(.clang-format): a definition starts at column 0 and its body opens with "{" alone on the
next lines' first column and closes with "}" alone at column 0.

    tools/check_limits.py [ROOT]      exit 0 within the limits, 1 with the list of offenders
"""
import os
import re
import subprocess
import sys

FILE_MAX = 1200
FUNCTION_MAX = 120
NAME = re.compile(r"^(?:[A-Za-z_][\w \*]*?[\s\*])?([A-Za-z_]\w*)\s*\(")
ATTRIBUTE = "__attribute__"


def without_attributes(line):
    """line with its __attribute__((...)) groups taken out (their parentheses nest)."""
    while ATTRIBUTE in line:
        i = line.index(ATTRIBUTE)
        j, depth = line.find("(", i), 0
        if j < 0:
            break
        for k in range(j, len(line)):
            depth += {"(": 1, ")": -1}.get(line[k], 0)
            if depth == 0:
                line = line[:i] + line[k + 1:].lstrip()
                break
        else:
            break
    return line


def sources(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "*.c", "*.h"], check=True,
                         capture_output=True, text=True).stdout.split()
    return [p for p in out if not p.startswith("tests/")]


def functions(lines):
    """(name, first line, last line) of every function definition, 1-based."""
    found, start, name, opened = [], None, None, False
    for i, line in enumerate(lines, 1):
        if opened:
            if line.rstrip() == "}":
                found.append((name, start, i))
                start, opened = None, False
            continue
        if start is not None and line.startswith("{"):
            opened = True
            continue
        if start is not None and line.rstrip().endswith(";"):
            start = None  # the last line of a declaration
            continue
        m = NAME.match(without_attributes(line))
        if m and not line.startswith(("#", "typedef")):
            start, name = (None, None) if line.rstrip().endswith(";") else (i, m.group(1))
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = []
    for path in sources(root):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            lines = f.read().split("\n")
        if len(lines) - 1 > FILE_MAX:
            bad.append(f"{path}: {len(lines) - 1} lines (at most {FILE_MAX})")
        if path.endswith(".c"):
            for name, first, last in functions(lines):
                if last - first + 1 > FUNCTION_MAX:
                    bad.append(f"{path}:{first}: {name} is {last - first + 1} lines "
                               f"(at most {FUNCTION_MAX})")
    for b in bad:
        print(b)
    print(f"check_limits: {len(bad)} over the limits")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
