"""Whether two package trees compile to the same machine code, without a GPU: the check
that lets a refactor of a kernel land before a GPU has run it.

    python scripts/sass_same.py OTHER_ROOT [--only SUBSTRING ...] [--root ROOT]

Runs ``scripts/compile_check.py --ptx-dir`` on each tree (ROOT: this checkout by
default), assembles every entry's PTX for sm_90 and compares the SASS instruction by
instruction.  It runs one worker: where a worker compiles several entries, the order it
meets them in can change the code (two runs of one tree at ``-j 2`` differed in two
paged decode kernels).  The kernels' own mangled symbols are left out of the comparison: they name
the closure they were built in, and so change with any edit to the module.  One line an
entry; exit status 1 if any differs.  Needs ptxas and nvdisasm as ``sass_count.py`` does.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SYMBOL = re.compile(r"_ZN\w+")
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def ptx_of(root, only, folder):
    cmd = [sys.executable, os.path.join(HERE, "compile_check.py"), "--root", root,
           "--ptx-dir", folder, "-j", "1"]  # (one worker: the same compile order in both trees)
    for o in only:
        cmd += ["--only", o]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return {os.path.basename(p): p for p in glob.glob(os.path.join(folder, "*.ptx"))}


def instructions(ptx_path):
    sys.argv = sys.argv[:1]  # sass_count reads a package folder from argv: none here
    sys.path.insert(0, HERE)
    import sass_count

    with open(ptx_path) as f:
        regs, _, text = sass_count.ptx_sass(f.read())
    # (spaces collapsed: nvdisasm pads its comments by the length of the symbols' names)
    return regs, [" ".join(SYMBOL.sub("SYMBOL", i).split()) for i in INSTRUCTION.findall(text)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("other")
    ap.add_argument("--root", default=os.path.dirname(HERE))
    ap.add_argument("--only", action="append", default=[])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        mine = ptx_of(os.path.abspath(args.root), args.only, os.path.join(d, "a"))
        theirs = ptx_of(os.path.abspath(args.other), args.only, os.path.join(d, "b"))
        differ = 0
        for name in sorted(set(mine) | set(theirs)):
            if name not in mine or name not in theirs:
                print(f"only in {'this tree' if name in mine else 'the other'}: {name}")
                differ += 1
                continue
            (ra, a), (rb, b) = instructions(mine[name]), instructions(theirs[name])
            same = a == b
            differ += not same
            print(f"{'same' if same else 'DIFFERS'}  {len(a):5d}/{len(b):<5d} instructions  "
                  f"{ra}/{rb} registers  {name[:-4]}")
        print(f"{len(set(mine) | set(theirs)) - differ} the same, {differ} differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
