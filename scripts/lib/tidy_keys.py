"""Prints "KEY FILE" per C++ source file for scripts/tidy.sh's result cache.

usage: tidy_keys.py BUILD_DIR SALT FILE...

KEY is a SHA-256 over SALT (clang-tidy's version and .clang-tidy), the
file's compile command from BUILD_DIR/compile_commands.json and its
preprocessed text with comments kept (-E -C). A change to the file, to any
header it includes, to its flags or to a NOLINT comment changes the key, so
a cached clean result is reused only for exactly what was checked. A file
the database does not compile prints "- FILE"; one whose preprocessing
fails prints "! FILE" (clang-tidy then runs and reports why).
"""
import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys


def command_of(entry):
    args = entry.get("arguments") or shlex.split(entry["command"])
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MQ", "-MT"):
            skip = True
        elif a not in ("-c", "-MD", "-MMD"):
            out.append(a)
    return out


def key_of(entry, salt):
    cmd = command_of(entry)
    h = hashlib.sha256(salt.encode())
    h.update("\0".join(cmd).encode())
    pre = subprocess.run(cmd + ["-E", "-C", "-o", "-"], cwd=entry["directory"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if pre.returncode != 0:
        return "!"
    h.update(pre.stdout)
    return h.hexdigest()


def main(build_dir, salt, *files):
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        db = json.load(f)
    entries = {}
    for e in db:  # a file compiled twice is checked with its first command
        path = os.path.realpath(os.path.join(e["directory"], e["file"]))
        entries.setdefault(path, e)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = []
        for name in files:
            e = entries.get(os.path.realpath(name))
            jobs.append((name, pool.submit(key_of, e, salt) if e else None))
        for name, job in jobs:
            print(job.result() if job else "-", name)


if __name__ == "__main__":
    main(*sys.argv[1:])
