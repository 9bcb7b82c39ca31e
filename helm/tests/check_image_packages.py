#!/usr/bin/env python3
"""Checks the Dockerfile's package lists against Debian 12 and the binaries.

usage: check_image_packages.py <repo> [<bin dir with rtable-core and rtable-operator>]

- every package the Dockerfile installs exists in this machine's apt lists (Debian 12);
- the build stage installs exactly the non-test list of scripts/install-deps.sh;
- every shared library the binaries load (ldd) belongs (dpkg -S) to a runtime package or to one
  of their dependencies (apt-cache depends --recurse), so the runtime image can run them.
Without a bin dir holding both binaries, the last check is skipped (and says so).
"""
import os
import re
import subprocess
import sys

# Sanitizer runtimes of the asan/tsan builds: never in a release image.
SANITIZER_LIBS = re.compile(r"lib(asan|ubsan|tsan|lsan)\.so")


def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def stage_packages(dockerfile, stage):
    """The packages of `apt-get install` in the stage named `stage`."""
    text = re.sub(r"\\\n", " ", open(dockerfile).read())
    current, packages = None, []
    for line in text.splitlines():
        m = re.match(r"\s*FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            current = m.group(1)
            continue
        if current == stage and "apt-get install" in line:
            tail = line.split("apt-get install", 1)[1].split("&&")[0]
            packages += [w for w in tail.split() if not w.startswith("-")]
    return packages


def install_deps_packages(script):
    text = open(script).read()
    block = re.search(r"^packages=\((.*?)^\)", text, re.S | re.M).group(1)
    words = []
    for line in block.splitlines():
        words += line.split("#", 1)[0].split()
    return words


def main():
    repo = sys.argv[1]
    bin_dir = sys.argv[2] if len(sys.argv) > 2 else ""
    dockerfile = os.path.join(repo, "Dockerfile")
    failures = []
    build = stage_packages(dockerfile, "build")
    runtime = stage_packages(dockerfile, "runtime")
    if not build or not runtime:
        failures.append(f"no apt-get install found in the build ({build}) or runtime ({runtime}) stage")

    wanted = install_deps_packages(os.path.join(repo, "scripts/install-deps.sh"))
    if sorted(build) != sorted(wanted):
        failures.append(f"build stage packages differ from scripts/install-deps.sh: only in the "
                        f"Dockerfile {sorted(set(build) - set(wanted))}, only in install-deps.sh "
                        f"{sorted(set(wanted) - set(build))}")

    for package in build + runtime:
        if run("apt-cache", "show", "--no-all-versions", package).returncode != 0:
            failures.append(f"package {package} is not in Debian 12's lists (apt-cache show)")

    binaries = [os.path.join(bin_dir, b) for b in ("rtable-core", "rtable-operator")] if bin_dir else []
    if binaries and all(os.access(b, os.X_OK) for b in binaries):
        deps = run("apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                   "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *runtime)
        closure = set(runtime)
        for line in deps.stdout.splitlines():
            line = line.strip()
            if line.startswith(("Depends:", "PreDepends:", "|Depends:", "|PreDepends:")):
                closure.add(line.split(":", 1)[1].strip().strip("<>").split(":")[0])
            elif line and not line.startswith("|"):
                closure.add(line.split(":")[0])
        libraries = set()
        for binary in binaries:
            out = run("ldd", binary)
            if out.returncode != 0:
                failures.append(f"ldd {binary}: {out.stderr.strip()}")
            for m in re.finditer(r"^\s*(\S+) => (\S+)", out.stdout, re.M):
                if m.group(2) == "not":
                    failures.append(f"{binary}: {m.group(1)} not found")
                elif not SANITIZER_LIBS.search(m.group(1)):
                    libraries.add(m.group(2))
        owners = {}
        for library in sorted(libraries):
            out = run("dpkg", "-S", os.path.realpath(library))
            if out.returncode != 0:
                out = run("dpkg", "-S", library)
            if out.returncode != 0:
                failures.append(f"{library}: no package owns it (dpkg -S)")
                continue
            owners[library] = out.stdout.split(":", 1)[0]
        for library, package in owners.items():
            if package not in closure:
                failures.append(f"{library} comes from {package}, which the runtime stage does "
                                f"not install (nor any of its dependencies)")
        direct = sorted({p for p in owners.values() if p in runtime})
        print(f"check_image_packages: {len(libraries)} shared libraries of the binaries, from "
              f"{len(set(owners.values()))} packages; runtime stage lists {direct}")
    else:
        print(f"check_image_packages: SKIP the ldd check: no rtable-core and rtable-operator in "
              f"'{bin_dir}' (set RTABLE_BIN_DIR)")

    for failure in failures:
        print(f"check_image_packages: FAIL {failure}")
    if not failures:
        print(f"check_image_packages: ok, build stage {len(build)} packages = install-deps.sh, "
              f"runtime stage {len(runtime)} packages, all in Debian 12")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
