"""The README's runnable usage example runs as written (on whatever device is here)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python block"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md (usage example)", "exec"), {"__name__": "readme_example"})
    lines = out.getvalue().splitlines()
    assert lines[0] == "['fc1', 'fc2']"
    assert float(lines[1]) < 1e-5 and float(lines[2]) < 1e-5  # the same function, and equivariant
    assert "backend" in lines[3]
