#!/usr/bin/env python3
"""Fails when an `unsafe` block or impl has no `// SAFETY:` comment within the six lines
above it (or on its own line). Usage: python3 scripts/check-safety.py"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
bad = []
for path in sorted(root.glob("**/*.rs")):
    if "target" in path.parts:
        continue
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        code = line.split("//")[0]
        if re.search(r"\bunsafe\s*(\{|impl\b)", code):
            window = lines[max(0, i - 6): i + 1]
            if not any("SAFETY" in w for w in window):
                bad.append(f"{path.relative_to(root)}:{i + 1}: {line.strip()}")
for b in bad:
    print("unsafe without a SAFETY comment:", b)
print(f"safety-comments: {0 if bad else 1} passed, {1 if bad else 0} failed")
sys.exit(1 if bad else 0)
