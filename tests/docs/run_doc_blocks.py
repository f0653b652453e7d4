#!/usr/bin/env python3
"""Runs the shell examples of README.md and docs/*.md and checks their transcripts.

Keeps the documentation true the way Python's doctest and Rust's doc tests do. A block is
run only when the line just before its opening fence is a marker comment:

    <!-- doctest -->                     run this ```console or ```sh block
    <!-- doctest: exit=1 -->             its last command must exit 1 (others exit 0)
    <!-- doctest: file=run.ini -->       write this block (any language) to run.ini instead
    <!-- doctest: setup=CMD -->          run CMD (no output check) before the block

(Options combine, separated by spaces; a setup command is the rest of the comment.)

In a ```console block, `$ ` starts a command (a line ending in `\\` continues it) and the
lines up to the next command are its expected output, stdout and stderr together. In a
```sh block every line is run and only the exit status counts. Expected output matches
when every line matches the same actual line, where `...` inside a line stands for any
text (timings, rates, byte counts: what varies from one machine or run to the next) and a
line that is just `...` stands for any number of lines.

The blocks of one markdown file run in order, in one scratch directory (state carries
from block to block, as for a reader who follows the page), which holds `data/train.h5`
and `data/test.h5` copied from the e2e fixture's data, with `ringtrain` first on PATH.
Commands run in one bash per page (a `cd` or a variable carries over), with
`set -o pipefail`, stdin from /dev/null; mpirun runs as root through the
OMPI_ALLOW_RUN_AS_ROOT variables; OMP_NUM_THREADS and RINGTRAIN_* are cleared.

usage: run_doc_blocks.py --bin DIR --data DIR --work DIR [--show] FILE.md...
  --show   print each command's actual output (to paste into a transcript)
Exit 0 when every block passes; 1 otherwise, naming the file, line and difference.
"""

import argparse
import os
import re
import select
import shutil
import subprocess
import sys

MARKER = re.compile(r"^<!--\s*doctest(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")


class Block:
    def __init__(self, path, line, lang, lines, options):
        self.path, self.line, self.lang, self.lines = path, line, lang, lines
        self.options = options


def parse_options(text):
    opts = {}
    if not text:
        return opts
    setup = re.search(r"setup=(.*)$", text)
    if setup:
        opts["setup"] = setup.group(1).strip()
        text = text[: setup.start()]
    for item in text.split():
        key, _, value = item.partition("=")
        opts[key] = value
    return opts


def find_blocks(path):
    """The marked blocks of one markdown file, in order."""
    lines = open(path, encoding="utf-8").read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m and i + 1 < len(lines) and FENCE.match(lines[i + 1]):
            lang = FENCE.match(lines[i + 1]).group(1)
            j = i + 2
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            blocks.append(Block(path, i + 2, lang, lines[i + 2 : j], parse_options(m.group(1))))
            i = j
        i += 1
    return blocks


def console_commands(block):
    """[(command, expected lines)] of a ```console block."""
    out, cmd, expected, cont = [], None, [], False
    for line in block.lines:
        if cont:
            cmd += "\n" + line
            cont = line.endswith("\\")
        elif line.startswith("$ "):
            if cmd is not None:
                out.append((cmd, expected))
            cmd, expected = line[2:], []
            cont = line.endswith("\\")
        elif cmd is None:
            raise ValueError(f"{block.path}:{block.line}: console block starts with no '$ ' command")
        else:
            expected.append(line)
    if cmd is not None:
        out.append((cmd, expected))
    return out


def line_matches(want, got):
    if "..." not in want:
        return want == got
    pattern = ".*".join(re.escape(part) for part in want.split("..."))
    return re.fullmatch(pattern, got) is not None


def output_matches(want, got):
    """want: expected lines with `...` wildcards; got: actual lines."""
    if not want:
        return True  # no transcript shown: only the exit status counts
    memo = {}

    def match(i, j):
        if (i, j) in memo:
            return memo[i, j]
        if i == len(want):
            r = j == len(got)
        elif want[i].strip() == "...":
            r = any(match(i + 1, k) for k in range(j, len(got) + 1))
        else:
            r = j < len(got) and line_matches(want[i], got[j]) and match(i + 1, j + 1)
        memo[i, j] = r
        return r

    return match(0, 0)


class Shell:
    """One bash for all the blocks of a page, so `cd`, variables and functions carry over
    from command to command as they do for a reader typing them. Each command's stdout and
    stderr go to a file outside the scratch directory; bash's own stdout carries only the
    exit status after each command."""

    def __init__(self, cwd, env, outdir):
        self.outdir, self.n = outdir, 0
        self.p = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.send("set -o pipefail")

    def send(self, text):
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()

    def run(self, cmd, timeout):
        """(exit status, output) of cmd; raises TimeoutError."""
        self.n += 1
        out = os.path.join(self.outdir, f"out.{self.n}")
        self.send(f"{{\n{cmd}\n}} >{out} 2>&1 </dev/null; echo \"@@doctest $?\"")
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(cmd)
        line = self.p.stdout.readline()
        if not line.startswith("@@doctest "):
            raise RuntimeError(f"the shell ended while running `{cmd}`")
        with open(out, errors="replace") as f:
            return int(line.split()[1]), f.read()

    def close(self):
        self.p.stdin.close()
        self.p.kill()
        self.p.wait()


def main():
    ap = argparse.ArgumentParser(description="run the marked shell blocks of markdown files")
    ap.add_argument("--bin", required=True, help="directory holding the ringtrain binary")
    ap.add_argument("--data", required=True, help="directory holding train.h5 and test.h5")
    ap.add_argument("--work", required=True, help="scratch directory (emptied first)")
    ap.add_argument("--show", action="store_true", help="print each command's actual output")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()

    env = {k: v for k, v in os.environ.items()
           if k != "OMP_NUM_THREADS" and not k.startswith("RINGTRAIN_")}
    env["PATH"] = os.path.abspath(args.bin) + os.pathsep + env.get("PATH", "")
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", LC_ALL="C")

    failures, ran = [], 0
    for path in args.files:
        blocks = find_blocks(path)
        if not blocks:
            continue
        scratch = os.path.join(args.work, os.path.basename(path).replace(".md", ""))
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(os.path.join(scratch, "data"))
        scratch_out = scratch + ".out"  # the commands' output files, not seen by `ls`
        shutil.rmtree(scratch_out, ignore_errors=True)
        os.makedirs(scratch_out)
        for name in ("train.h5", "test.h5"):
            shutil.copy(os.path.join(args.data, name), os.path.join(scratch, "data", name))
        shell = Shell(scratch, env, scratch_out)
        for b in blocks:
            where = f"{path}:{b.line}"
            ran += 1
            if "file" in b.options:
                with open(os.path.join(scratch, b.options["file"]), "w") as f:
                    f.write("\n".join(b.lines) + "\n")
                print(f"ok: {where} wrote {b.options['file']}")
                continue
            if "setup" in b.options:
                rc, out = shell.run(b.options["setup"], 600)
                if rc != 0:
                    failures.append(f"{where}: setup '{b.options['setup']}' exited {rc}:\n{out}")
                    continue
            if b.lang == "console":
                commands = console_commands(b)
            elif b.lang == "sh":
                commands = [("\n".join(b.lines), [])]
            else:
                failures.append(f"{where}: a doctest block must be console or sh, not '{b.lang}'")
                continue
            want_rc = int(b.options.get("exit", "0"))
            for n, (cmd, expected) in enumerate(commands):
                last = n == len(commands) - 1
                try:
                    rc, out = shell.run(cmd, 600)
                except TimeoutError:
                    failures.append(f"{where}: `{cmd}` ran past 600 s")
                    shell.close()  # its state is lost: a fresh one for the next blocks
                    shell = Shell(scratch, env, scratch_out)
                    break
                got = out.splitlines()
                if args.show:
                    print(f"--- {where} $ {cmd}\n{out}--- exit {rc}")
                expect_rc = want_rc if last else 0
                if rc != expect_rc:
                    failures.append(f"{where}: `{cmd}` exited {rc}, expected {expect_rc}:\n{out}")
                    break
                if not output_matches(expected, got):
                    failures.append(f"{where}: `{cmd}` printed something else.\n"
                                    "expected:\n" + "\n".join(expected) +
                                    "\ngot:\n" + "\n".join(got))
                    break
            else:
                print(f"ok: {where} ({len(commands)} command(s))")
        shell.close()
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    print(f"{ran} doc block(s) run, {len(failures)} failed")
    return 1 if failures or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
