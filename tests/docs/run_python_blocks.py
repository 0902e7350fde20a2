"""The guides' Python: every ```python block of docs/*.md is compiled, and the whole
programs among them (those with an `if __name__ == "__main__":`) are run.

    python3 run_python_blocks.py <docs dir>

Exits 1 naming the guide and line of a block that fails, 0 when all pass.
"""
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^( *)```(\w*)\s*$")


def blocks(path):
    """(first line, code) of each ```python block of a guide."""
    out, code, start, lang = [], None, 0, None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line)
            if code is None and m and m.group(2):
                lang, code, start = m.group(2), [], n + 1
            elif code is not None and m and not m.group(2):
                if lang == "python":
                    out.append((start, "".join(code)))
                code = None
            elif code is not None:
                code.append(line)
    return out


def main():
    docs = sys.argv[1]
    failed = 0
    ran = 0
    for name in sorted(os.listdir(docs)):
        if not name.endswith(".md"):
            continue
        for line, code in blocks(os.path.join(docs, name)):
            where = f"docs/{name}:{line}"
            try:
                compile(code, where, "exec")
            except SyntaxError as e:
                print(f"{where}: does not compile: {e}")
                failed += 1
                continue
            if '__name__ == "__main__"' not in code:
                continue
            with tempfile.TemporaryDirectory() as d:
                script = os.path.join(d, "block.py")
                with open(script, "w", encoding="utf-8") as f:
                    f.write(code)
                r = subprocess.run([sys.executable, script], cwd=d, capture_output=True, text=True, timeout=300)
            ran += 1
            print(f"{where}: exit {r.returncode}\n{r.stdout}{r.stderr}")
            if r.returncode != 0:
                failed += 1
    print(f"run_python_blocks: {ran} programs run, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
