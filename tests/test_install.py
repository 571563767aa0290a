#!/usr/bin/env python3
"""test_install.py - what `meson install` puts in place, and many processes
started at once through scripts/cudefer and through the installed command.

usage: test_install.py layout|ranks --build DIR --source DIR --prefix P
           --bindir D --libdir D --includedir D --mandir D --version V
           --soversion S [--child PATH --testdriver DIR --toolkit DIR
           --processes N]

Both modes first install the build into a temporary folder
(meson install --destdir), then:

  layout  checks the installed files: bin/cudefer, the library under its
          soname (libcudefer.so.S -> libcudefer.so.V, and libcudefer.so),
          include/cudefer.h, cudefer.pc (pkg-config: version, flags, the
          preload variable) and the man page cudefer(1); and that the command
          finds the library beside it when the installation is moved (staged
          with DESTDIR, or reached through a symbolic link).

  ranks   starts N processes (ranks_child K, a different K each) at once,
          twice: through scripts/cudefer with an empty build folder of its own
          (CUDEFER_BUILD_DIR), so that they race to build it, as mpirun or
          srun would on a fresh clone, with CUDEFER_REPORT=DIR/report-%p.json;
          and through the installed command with --report DIR/report-%p.json.
          Every process must succeed, only one of the first N may build, and
          each must leave exactly one report, report-<its pid>.json: valid
          JSON that names its pid, its program, the host, the versions, when
          it ran, the options, and exactly its own releases (K device and K
          pinned host releases taken by cudefer; nothing passed, nothing
          failed, no other kind).

Exit status 0 when every check passed, 1 otherwise. The temporary folder is
removed when all passed and kept (its path printed) when not.
"""
import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what)
    return ok


def installed(args, stage, folder, name=""):
    """The staged path of a file installed in folder (prefix-relative or
    absolute), as meson install --destdir places it."""
    path = os.path.join(args.prefix, folder, name)
    return os.path.join(stage, path.lstrip("/"))


def install(args, tmp):
    stage = os.path.join(tmp, "stage")
    result = subprocess.run(
        ["meson", "install", "-C", args.build, "--no-rebuild", "--quiet", "--destdir", stage],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if result.returncode != 0:
        print(result.stdout)
        raise SystemExit("FAIL: meson install --destdir %s (exit status %d)"
                         % (stage, result.returncode))
    return stage


def run(argv, env=None):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env)


def check_layout(args, stage, tmp):
    command = installed(args, stage, args.bindir, "cudefer")
    check(os.path.isfile(command) and os.access(command, os.X_OK),
          "bin/cudefer is installed and executable")

    lib = lambda name: installed(args, stage, args.libdir, name)
    real = "libcudefer.so." + args.version
    soname = "libcudefer.so." + args.soversion
    check(os.path.isfile(lib(real)) and not os.path.islink(lib(real)),
          "%s is the library's file" % real)
    check(os.path.islink(lib(soname)) and os.readlink(lib(soname)) == real,
          "%s -> %s" % (soname, real))
    check(os.path.islink(lib("libcudefer.so")) and os.readlink(lib("libcudefer.so")) == soname,
          "libcudefer.so -> %s (for linking)" % soname)
    if os.path.isfile(lib(real)):
        dynamic = run(["readelf", "-d", lib(real)]).stdout
        check("Library soname: [%s]" % soname in dynamic, "the library's soname is " + soname)

    header = installed(args, stage, args.includedir, "cudefer.h")
    source_header = os.path.join(args.source, "include", "cudefer.h")
    check(os.path.isfile(header) and open(header).read() == open(source_header).read(),
          "include/cudefer.h is installed")

    pcdir = installed(args, stage, args.libdir, "pkgconfig")
    check(os.path.isfile(os.path.join(pcdir, "cudefer.pc")), "cudefer.pc is installed")
    env = dict(os.environ, PKG_CONFIG_PATH=pcdir, PKG_CONFIG_LIBDIR=pcdir)
    pc = lambda *a: run(["pkg-config"] + list(a) + ["cudefer"], env).stdout.strip()
    check(pc("--modversion") == args.version, "pkg-config --modversion cudefer")
    includedir = os.path.join(args.prefix, args.includedir)
    check("-I" + includedir in pc("--cflags").split() or includedir == "/usr/include",
          "pkg-config --cflags cudefer names " + includedir)
    check("-lcudefer" in pc("--libs").split(), "pkg-config --libs cudefer has -lcudefer")
    preload = pc("--variable=preload")
    check(preload == os.path.join(args.prefix, args.libdir, soname),
          "pkg-config --variable=preload cudefer is the soname's path (got %r)" % preload)
    check(os.path.exists(os.path.join(stage, preload.lstrip("/"))),
          "the preload variable names an installed file")

    man = installed(args, stage, args.mandir, "man1/cudefer.1")
    check(os.path.isfile(man) and "CUDEFER_ENABLE" in open(man).read(),
          "share/man/man1/cudefer.1 is installed and lists the variables")

    # The staged command finds the staged library, directly and through a link.
    link = os.path.join(tmp, "elsewhere", "cudefer")
    os.makedirs(os.path.dirname(link))
    os.symlink(command, link)
    want = "library: " + os.path.realpath(lib(os.path.basename(preload)))
    for path in (command, link):
        out = run([path, "--version"]).stdout.splitlines()
        got = ["library: " + os.path.realpath(line[len("library: "):])
               for line in out if line.startswith("library: ")]
        check(out[:1] == ["cudefer " + args.version] and got == [want],
              "%s --version names the installed library (got %r)" % (path, out))


def option_names(command):
    """The CUDEFER_ names (without the prefix) that the command's --help lists."""
    names = []
    for line in run([command, "--help"]).stdout.splitlines():
        if line.startswith("  CUDEFER_"):
            names.append(line[10:].replace("=", " ").split()[0])
    return names


def parse_time(text):
    if not isinstance(text, str):
        return None
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.utcoffset() == datetime.timedelta(0) else None


def check_report(path, pid, rounds, args, options):
    where = "%s (pid %d)" % (os.path.basename(path), pid)
    if not check(os.path.isfile(path), "%s exists" % where):
        return
    try:
        with open(path) as f:
            r = json.load(f)
    except ValueError as e:
        check(False, "%s is valid JSON: %s" % (where, e))
        return
    if not check(isinstance(r, dict), "%s is a JSON object" % where):
        return
    check(r.get("pid") == pid, "%s: pid %r" % (where, r.get("pid")))
    program = r.get("program")
    check(isinstance(program, str) and os.path.basename(program) == "ranks_child",
          "%s: program %r (argv[0] or its base name)" % (where, program))
    check(r.get("host") == socket.gethostname(), "%s: host %r" % (where, r.get("host")))
    check(r.get("cudefer_version") == args.version,
          "%s: cudefer_version %r" % (where, r.get("cudefer_version")))
    driver = r.get("driver_version", "absent")
    check(driver is None or driver == 13000,  # the test driver's
          "%s: driver_version %r" % (where, driver))
    start, end = parse_time(r.get("start")), parse_time(r.get("end"))
    check(start is not None and end is not None and start <= end,
          "%s: start %r and end %r are ISO 8601 UTC times, in order"
          % (where, r.get("start"), r.get("end")))
    opts = r.get("options")
    check(isinstance(opts, dict) and all(isinstance(opts.get(n), str) for n in options),
          "%s: options has every variable of the table as text (%s)" % (where, options))
    kinds = r.get("kinds") if isinstance(r.get("kinds"), dict) else {}
    for counter in ("deferred", "released", "reused", "dropped", "passed", "errors"):
        check(isinstance(kinds.get(counter), dict), "%s: kinds.%s" % (where, counter))
    deferred = kinds.get("deferred") or {}
    want = {k: 0 for k in deferred}
    want.update(device=rounds, host=rounds)
    check(deferred == want, "%s: kinds.deferred %r, expected %r" % (where, deferred, want))
    for counter in ("passed", "errors"):
        counts = kinds.get(counter) or {}
        check(all(v == 0 for v in counts.values()),
              "%s: kinds.%s all 0: %r" % (where, counter, counts))


def start_ranks(label, argv_of, env, reports, args, options):
    """Starts the processes at once, waits for them, checks their reports."""
    os.makedirs(reports)
    rounds = [3 + 2 * i for i in range(args.processes)]
    procs = [subprocess.Popen(argv_of(k), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True)
             for k in rounds]
    outputs = [p.communicate(timeout=240) for p in procs]
    print("%s: %d processes" % (label, len(procs)))
    pids = []
    for p, k, (out, err) in zip(procs, rounds, outputs):
        line = "ranks_child pid=%d device=%d host=%d" % (p.pid, k, k)
        ok = check(p.returncode == 0 and line in out.splitlines(),
                   "%s: process %d (ranks_child %d) exit status %d, printed %s"
                   % (label, p.pid, k, p.returncode, line))
        if not ok:
            print("  stdout: %s\n  stderr: %s" % (out.strip(), err.strip()))
        pids.append(p.pid)
    expected = sorted("report-%d.json" % pid for pid in pids)
    found = sorted(os.listdir(reports))
    check(found == expected, "%s: the reports are %s (found %s)" % (label, expected, found))
    for pid, k in zip(pids, rounds):
        check_report(os.path.join(reports, "report-%d.json" % pid), pid, k, args, options)
    return outputs


def check_ranks(args, stage, tmp):
    command = installed(args, stage, args.bindir, "cudefer")
    options = option_names(command)
    check(len(options) > 0, "the command's --help lists the CUDEFER_ variables")
    env = dict(os.environ)
    for name in list(env):
        if name.startswith("CUDEFER_"):
            del env[name]
    env["LD_LIBRARY_PATH"] = args.testdriver + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["CUDA_PATH"] = args.toolkit

    # 1. scripts/cudefer on an empty build folder: they race to build it.
    reports = os.path.join(tmp, "scripts-cudefer")
    env1 = dict(env, CUDEFER_BUILD_DIR=os.path.join(tmp, "build"),
                CUDEFER_REPORT=os.path.join(reports, "report-%p.json"))
    script = os.path.join(args.source, "scripts", "cudefer")
    outputs = start_ranks("scripts/cudefer", lambda k: [script, args.child, str(k)],
                          env1, reports, args, options)
    builders = sum(1 for _, err in outputs if "building in" in err)
    check(builders == 1, "scripts/cudefer: one process built, the others waited (%d built)"
          % builders)

    # 2. The installed command.
    reports = os.path.join(tmp, "installed-cudefer")
    start_ranks("installed cudefer",
                lambda k: [command, "--report", os.path.join(reports, "report-%p.json"),
                           args.child, str(k)],
                env, reports, args, options)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["layout", "ranks"])
    for name in ("build", "source", "prefix", "bindir", "libdir", "includedir", "mandir",
                 "version", "soversion"):
        parser.add_argument("--" + name, required=True)
    parser.add_argument("--child")
    parser.add_argument("--testdriver")
    parser.add_argument("--toolkit")
    parser.add_argument("--processes", type=int, default=6)
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="cudefer-install-")
    stage = install(args, tmp)
    if args.mode == "layout":
        check_layout(args, stage, tmp)
    else:
        check_ranks(args, stage, tmp)
    if failures:
        print("%d check(s) failed; files kept in %s" % (len(failures), tmp))
        return 1
    shutil.rmtree(tmp)
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
