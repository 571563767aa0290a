#!/usr/bin/env python3
"""report.py - tables and the summary of the real-GPU checks.

usage: report.py RESULTS_FILE

RESULTS_FILE is what scripts/gpu-check.sh collects: one line per program
run and per result line of a program,

    RUN check=<check> mode=<mode> id=<id> rc=<exit status|skipped> secs=<s>
    RESULT <name> check=<check> mode=<mode> id=<id> key=value ...

(mode: none = no shim, passthrough = shim with CUDEFER_ENABLE=0, shim =
shim enabled). Prints one table per check, then the summary table: one line
per check with PASS or FAIL and its key numbers. Exit status 0 when every
check passed, 1 otherwise.
"""
import os
import statistics
import sys
from collections import defaultdict

GOAL_MS = 0.05  # what a release or a launch may cost with the shim (check 2)

MODES = ("none", "passthrough", "shim")
MODE_TITLES = {"none": "no shim", "passthrough": "ENABLE=0", "shim": "shim"}

DOORS_PROGRAMS = ("rt_static", "rt_shared", "drv", "torch")
DOORS_EXPECTED = {
    "rt_static": ("cuMemFree_v2", "cuMemFreeHost", "cuMemHostUnregister", "cuArrayDestroy"),
    "rt_shared": ("cuMemFree_v2", "cuMemFreeHost", "cuMemHostUnregister", "cuArrayDestroy"),
    "drv": ("cuMemFree_v2", "cuMemFreeHost", "cuMemHostUnregister", "cuArrayDestroy",
            "cuModuleUnload", "cuLibraryUnload", "cuCtxSynchronize"),
    "torch": ("cuMemFree_v2",),
}

STALL_BASELINE = "nothing(launch_alone)"
STALL_RELEASES = (
    "cuMemFree(cuMemAlloc)", "cuMemFree(cuMemAllocManaged)", "cuMemFreeHost(cuMemAllocHost)",
    "cuMemFreeHost(cuMemHostAlloc)", "cuMemHostUnregister", "cuArrayDestroy",
    "cuModuleUnload(second_module)", "cuLibraryUnload(kernel_loaded)",
)
# Differences from the driver that DESIGN.md asks for, with the codes the
# shim must give to count as intended: while a capture is live the shim
# only queues a release, so the capture is not invalidated.
CONFORM_BY_DESIGN = {
    "cuMemFree(in_global_capture)": "CUDA_SUCCESS",
    "cuMemFree(in_global_capture).end_capture": "CUDA_SUCCESS",
    "cuMemFreeHost(in_global_capture)": "CUDA_SUCCESS",
    "cuMemFreeHost(in_global_capture).end_capture": "CUDA_SUCCESS",
    "cuMemFree(global_capture_other_thread)": "CUDA_SUCCESS",
    "cuMemFree(global_capture_other_thread).end_capture": "CUDA_SUCCESS",
}
# Differences of the shim from the driver that are known and not intended
# (tests/test_conformance.c skips them under the shim with the same words):
# they still count as failures.
CONFORM_KNOWN_GAPS = {
    "cuMemFree(destroyed_context_current)":
        "a release with a destroyed context current is deferred",
    "cuMemHostAlloc(invalid_flag_after_release)":
        "reuse of a released block lets flag 0x80000000 through",
}

HAZARD_STREAMS = ("nonblocking", "blocking", "legacy", "perthread", "ptsz")
HAZARD_MEMORY = ("device", "managed", "hostmap")


# ---- reading -----------------------------------------------------------------

class Results:
    def __init__(self, path):
        self.runs = {}                     # (check, mode, id) -> fields
        self.results = defaultdict(list)   # name -> [fields]
        with open(path, errors="replace") as f:
            for line in f:
                words = line.split()
                if len(words) < 2:
                    continue
                if words[0] == "RUN":
                    fields = parse(words[1:])
                    key = (fields.get("check"), fields.get("mode"), fields.get("id"))
                    self.runs[key] = fields
                elif words[0] == "RESULT":
                    fields = parse(words[2:])
                    self.results[words[1]].append(fields)

    def of(self, name, **match):
        """The result lines called name whose fields match."""
        return [r for r in self.results.get(name, [])
                if all(r.get(k) == v for k, v in match.items())]

    def one(self, name, **match):
        found = self.of(name, **match)
        return found[-1] if found else None

    def run(self, check, mode, id_):
        return self.runs.get((check, mode, id_))

    def run_status(self, check, mode, id_):
        """'ok', 'not run', 'skipped', 'timeout' or 'exit N'."""
        r = self.run(check, mode, id_)
        if r is None:
            return "not run"
        rc = r.get("rc", "?")
        if rc == "0":
            return "ok"
        if rc == "skipped":
            return "skipped"
        if rc in ("124", "137"):
            return "timeout"
        if rc.isdigit() and int(rc) > 128:
            return "signal %d" % (int(rc) - 128)
        return "exit " + rc


def parse(words):
    fields = {}
    for w in words:
        k, sep, v = w.partition("=")
        if sep:
            fields[k] = v
    return fields


def num(fields, key, default=None):
    try:
        return float(fields[key])
    except (KeyError, TypeError, ValueError):
        return default


def names(items, most=3):
    """A short list for the summary: the first few, then how many more."""
    items = list(items)
    shown = ", ".join(items[:most])
    return shown + (" and %d more" % (len(items) - most) if len(items) > most else "")


def fmt_ms(v):
    if v is None:
        return "-"
    if v < 1:
        return "%.4f" % v
    if v < 100:
        return "%.2f" % v
    return "%.0f" % v


# ---- printing ----------------------------------------------------------------

def table(title, header, rows):
    print()
    print("### " + title)
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(str(cell)))
    line = "  ".join(h.ljust(widths[i]) for i, h in enumerate(header))
    print(line.rstrip())
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip())


# The summary lines each check of GPU_CHECK_ONLY (scripts/gpu-check.sh) makes.
SUMMARY_OF_CHECK = {"doors": ("doors",), "stall": ("stall",), "hazards": ("hazards", "faults"),
                    "deadlock": ("deadlock",), "oom": ("oom",), "conform": ("conformance",),
                    "capture": ("capture",)}


class Summary:
    def __init__(self):
        self.lines = []
        only = [c for c in os.environ.get("GPU_CHECK_ONLY", "").replace(" ", "").split(",") if c]
        # None: every check ran; else the summary lines of the checks picked.
        self.picked = None
        if only:
            self.picked = {"build"}
            for c in only:
                self.picked.update(SUMMARY_OF_CHECK.get(c, ()))

    def add(self, check, ok, numbers):
        if self.picked is not None and check not in self.picked:
            self.lines.append((check, "SKIP", "not run (GPU_CHECK_ONLY)"))
            return
        self.lines.append((check, "PASS" if ok else "FAIL", numbers))

    def failed(self):
        return any(status == "FAIL" for _, status, _ in self.lines)

    def print(self):
        print()
        print("### summary")
        width = max(len(c) for c, _, _ in self.lines)
        for check, status, numbers in self.lines:
            print("%s  %s  %s" % (check.ljust(width), status, numbers))


# ---- the checks --------------------------------------------------------------

def report_build(res, summary):
    rows = [(r.get("id"), r.get("status"), r.get("how", "")) for r in res.of("build")]
    table("build", ("step", "status", "how"), rows)
    failed = [r[0] for r in rows if r[1] != "ok"]
    how = next((r[2] for r in rows if r[0] == "shim"), "?")
    summary.add("build", bool(rows) and not failed,
                "shim built by %s; %d/%d steps ok%s" % (
                    how, len(rows) - len(failed), len(rows),
                    ("; failed: " + ", ".join(failed)) if failed else ""))


def report_doors(res, summary):
    rows, problems = [], []
    for prog in DOORS_PROGRAMS:
        statuses = [res.run_status("doors", m, prog) for m in MODES]
        cmp = res.one("doors_compare", id=prog) or {}
        reached = {r.get("name") for r in res.of("doors_name", id=prog)}
        missing = [n for n in DOORS_EXPECTED[prog] if n not in reached]
        same = cmp.get("same_passthrough") == "1" and cmp.get("same_shim") == "1"
        ok = all(s == "ok" for s in statuses) and same and cmp.get("done") == "1" and not missing
        rows.append((prog, *statuses, cmp.get("same_passthrough", "-"), cmp.get("same_shim", "-"),
                     cmp.get("lines", "-"), ",".join(missing) or "-", "ok" if ok else "FAIL"))
        if not ok:
            problems.append(prog)
    table("doors: the same output without the shim, with CUDEFER_ENABLE=0 and with the shim",
          ("program", "no shim", "ENABLE=0", "shim", "same(ENABLE=0)", "same(shim)",
           "stdout lines", "expected wrappers not reached", "verdict"), rows)

    door_rows = []
    for prog in DOORS_PROGRAMS:
        by_door = defaultdict(list)
        for r in res.of("doors_name", id=prog):
            by_door[r.get("via", "?").replace("_", " ")].append(r.get("name", "?"))
        for door in sorted(by_door):
            door_rows.append((prog, door, " ".join(sorted(by_door[door]))))
        h = res.one("doors_handouts", id=prog) or {}
        door_rows.append((prog, "(handouts)", "dlsym: %s, cuGetProcAddress: %s" % (
            h.get("dlsym", "?"), h.get("procaddr", "?"))))
    table("doors: wrapped names reached (CUDEFER_LOG=debug, 'first call of'), per door",
          ("program", "reached through", "names"), door_rows)
    summary.add("doors", not problems,
                "%d/%d programs identical in all 3 modes with their releases intercepted%s" % (
                    len(DOORS_PROGRAMS) - len(problems), len(DOORS_PROGRAMS),
                    ("; failing: " + names(problems, 4)) if problems else ""))


def stall_stats(res, mode, release):
    rows = res.of("stall", mode=mode, release=release)
    if not rows:
        return None
    rel = [num(r, "release_ms", float("inf")) for r in rows]
    lau = [num(r, "launch_ms", float("inf")) for r in rows]
    return {
        "release": statistics.median(rel), "launch": statistics.median(lau),
        "release_max": max(rel), "launch_max": max(lau), "n": len(rows),
        "rc_ok": all(r.get("rc") == "CUDA_SUCCESS" and r.get("launch_rc") == "CUDA_SUCCESS"
                     for r in rows),
        "valid": all(r.get("spin_before") == "1" for r in rows),
        "rcs": ",".join(sorted({r.get("rc", "?") for r in rows})),
    }


def report_stall(res, summary):
    """The goal: with the shim, the caller's median under GOAL_MS, and the
    other thread's launch blocked under GOAL_MS: its median time less the
    median time of the same launch when nothing is released (the row
    STALL_BASELINE), which is the launch's own cost."""
    rows, over, invalid = [], [], []
    worst_rel = worst_lau = 0.0
    alone = stall_stats(res, "shim", STALL_BASELINE)
    alone_ms = alone["launch"] if alone else 0.0
    if alone:
        row = ["(no release: the launch alone)"]
        for mode in MODES:
            s = stall_stats(res, mode, STALL_BASELINE)
            row += [fmt_ms(s["release"]) if s else "-", fmt_ms(s["launch"]) if s else "-"]
        rows.append(row + [fmt_ms(alone["release_max"]), fmt_ms(alone["launch_max"]),
                           alone["rcs"]])
    else:
        invalid.append("the launch alone")
    for release in STALL_RELEASES:
        row = [release]
        for mode in MODES:
            s = stall_stats(res, mode, release)
            row += [fmt_ms(s["release"]) if s else "-", fmt_ms(s["launch"]) if s else "-"]
        s = stall_stats(res, "shim", release)
        if s:
            row += [fmt_ms(s["release_max"]), fmt_ms(s["launch_max"]), s["rcs"]]
            worst_rel = max(worst_rel, s["release"])
            worst_lau = max(worst_lau, s["launch"] - alone_ms)
            if not (s["rc_ok"] and s["valid"]):
                invalid.append(release)
            elif not (s["release"] < GOAL_MS and s["launch"] - alone_ms < GOAL_MS):
                over.append(release)
        else:
            row += ["-", "-", "-"]
            invalid.append(release)
        rows.append(row)
    header = ["release (1 s kernel on another stream)"]
    for mode in MODES:
        header += ["%s: caller ms" % MODE_TITLES[mode], "%s: launch ms" % MODE_TITLES[mode]]
    header += ["shim max caller", "shim max launch", "shim rc"]
    table("stall: median ms the release blocked its caller / another thread's launch", header,
          rows)
    base = stall_stats(res, "none", STALL_RELEASES[0])
    run = res.run_status("stall", "shim", "stall")
    setup = res.one("stall_setup", mode="shim")
    if setup and setup.get("shim_loaded") != "1":
        run = "cudefer was not loaded"
    notes = []
    if over:
        notes.append("over the goal: " + names(over))
    if invalid:
        notes.append("error or kernel not running: " + names(invalid))
    if run != "ok":
        notes.append("shim run: " + run)
    summary.add("stall", not over and not invalid and run == "ok",
                "shim median worst: caller %s ms, launch blocked %s ms (above the "
                "launch alone, %s ms; goal < %s ms); "
                "no shim cuMemFree: caller %s ms, launch %s ms%s" % (
                    fmt_ms(worst_rel), fmt_ms(worst_lau), fmt_ms(alone_ms), GOAL_MS,
                    fmt_ms(base["release"]) if base else "-",
                    fmt_ms(base["launch"]) if base else "-",
                    "".join("; " + n for n in notes)))


def report_hazards(res, summary):
    rows, faults, invalid, missing = [], 0, [], []
    for stream in HAZARD_STREAMS:
        for memory in HAZARD_MEMORY:
            r = res.one("hazard", mode="shim", stream=stream, memory=memory)
            name = "%s/%s" % (stream, memory)
            if r is None:
                missing.append(name)
                rows.append((stream, memory, "-", "-", "-", res.run_status(
                    "hazards", "shim", "%s:%s" % (stream, memory)), "no result"))
                continue
            faults += r.get("fault") == "1"
            if r.get("writer_running") != "1":
                invalid.append(name)
            if r.get("release_rc") != "CUDA_SUCCESS":
                invalid.append(name + "(release " + r.get("release_rc", "?") + ")")
            rows.append((stream, memory, r.get("release_rc"), fmt_ms(num(r, "release_ms")),
                         r.get("writer_running"), r.get("sync_rc"), r.get("fault")))
    control = res.one("hazard", mode="none", stream="unsafe", memory="device")
    if control:
        rows.append(("unsafe control (no shim)", "device", control.get("release_rc"),
                     fmt_ms(num(control, "release_ms")), control.get("writer_running"),
                     control.get("sync_rc"), control.get("fault")))
    else:
        rows.append(("unsafe control (no shim)", "device", "-", "-", "-",
                     res.run_status("hazards", "none", "unsafe:device"), "no result"))
    table("hazards: release under a writer kernel, then cuCtxSynchronize (shim)",
          ("writer stream", "memory", "release rc", "release ms", "writer running",
           "cuCtxSynchronize", "fault"), rows)
    control_faulted = bool(control) and control.get("fault") == "1"
    ok = faults == 0 and not invalid and not missing and control_faulted
    notes = []
    if missing:
        notes.append("no result: " + names(missing))
    if invalid:
        notes.append("invalid (writer not running or release failed): " + names(invalid))
    if not control_faulted:
        notes.append("the unsafe control did not fault, so the check is unproven")
    summary.add("hazards", ok, "%d faults in %d shim runs; unsafe control: %s%s" % (
        faults, len(HAZARD_STREAMS) * len(HAZARD_MEMORY) - len(missing),
        control.get("sync_rc") if control else "no result",
        ("; " + "; ".join(notes)) if notes else ""))


def report_faults(res, summary):
    """The unsafe control run with cudefer, a pinned release queued before
    the fault: the program sees the driver's error (cuCtxSynchronize and a
    cuMemFree after it), exits normally (no crash, no hang), and cudefer
    reports on stderr what it dropped."""
    r = res.one("hazard", mode="shim", stream="unsafe", memory="device") or {}
    run = res.run_status("hazards", "shim", "unsafe:device")
    d = res.one("hazard_dropped", mode="shim")
    dropped = int(d.get("dropped", "0")) if d else 0
    queued = int(r.get("queued", "0"))
    table("faults: a kernel fault with releases queued (the unsafe control under cudefer)",
          ("mode", "queued before", "cuCtxSynchronize", "cuMemFree after", "reported dropped",
           "program"),
          [("cudefer", r.get("queued", "-"), r.get("sync_rc", "-"), r.get("after_rc", "-"),
            dropped if d else "-", run)])
    fault_rc = "CUDA_ERROR_ILLEGAL_ADDRESS"
    ok = (bool(r) and run == "ok" and r.get("sync_rc") == fault_rc and
          r.get("after_rc") == fault_rc and queued >= 1 and dropped >= queued)
    summary.add("faults", ok, "cuCtxSynchronize %s, cuMemFree after it %s; %s queued, %d "
                "reported dropped; program %s" % (
                    r.get("sync_rc", "no result"), r.get("after_rc", "-"),
                    r.get("queued", "-"), dropped, run))


def report_deadlock(res, summary):
    rows = []
    for mode in ("passthrough", "shim"):
        r = res.one("deadlock", mode=mode)
        if r:
            rows.append((MODE_TITLES[mode], r.get("release_rc"), fmt_ms(num(r, "release_ms")),
                         r.get("kernel_waiting"), r.get("watchdog_fired"), r.get("sync_rc"),
                         fmt_ms(num(r, "total_ms"))))
        else:
            rows.append((MODE_TITLES[mode], "-", "-", "-", "-",
                         res.run_status("deadlock", mode, "deadlock"), "-"))
    table("deadlock: cuMemFree while a kernel waits for a flag the caller sets afterwards",
          ("mode", "cuMemFree rc", "cuMemFree ms", "kernel waiting", "watchdog fired",
           "cuCtxSynchronize", "total ms"), rows)
    s = res.one("deadlock", mode="shim")
    p = res.one("deadlock", mode="passthrough")
    ok = bool(s) and s.get("watchdog_fired") == "0" and s.get("kernel_waiting") == "1" and \
        s.get("release_rc") == "CUDA_SUCCESS" and s.get("sync_rc") == "CUDA_SUCCESS"
    summary.add("deadlock", ok, "shim: cuMemFree %s ms, watchdog %s; ENABLE=0: cuMemFree %s ms, "
                "watchdog %s" % (
                    fmt_ms(num(s, "release_ms")) if s else "-",
                    ("not needed" if s.get("watchdog_fired") == "0" else "FIRED") if s else "-",
                    fmt_ms(num(p, "release_ms")) if p else "-",
                    ("fired" if p.get("watchdog_fired") == "1" else "not needed") if p else "-"))


def report_oom(res, summary):
    rows = []
    for mode in ("none", "shim"):
        lp = res.one("oom_loop", mode=mode)
        rf = res.one("oom_refill", mode=mode)
        mem = res.one("oom_memory", mode=mode)
        rows.append((MODE_TITLES[mode],
                     lp.get("rounds") if lp else res.run_status("oom", mode, "oom"),
                     lp.get("oom") if lp else "-",
                     lp.get("other_errors") if lp else "-",
                     fmt_ms(num(lp, "per_round_ms")) if lp else "-",
                     rf.get("chunks") if rf else "-",
                     rf.get("first_oom") if rf else "-",
                     rf.get("second_oom") if rf else "-",
                     fmt_ms(num(rf, "second_ms")) if rf else "-",
                     "%s/%s" % (mem.get("free_start_gib"), mem.get("free_end_gib")) if mem
                     else "-"))
    table("out-of-memory: 2 GiB alloc/touch/free rounds, and a 4 GiB-chunk refill",
          ("mode", "rounds", "OOM", "other errors", "ms/round", "refill chunks", "OOM 1st",
           "OOM 2nd", "2nd alloc ms", "free GiB start/end"), rows)
    lp = res.one("oom_loop", mode="shim")
    rf = res.one("oom_refill", mode="shim")
    ok = bool(lp) and bool(rf) and all(lp.get(k) == "0" for k in (
        "oom", "other_errors", "free_errors")) and lp.get("sync_rc") == "CUDA_SUCCESS" and \
        all(rf.get(k) == "0" for k in ("first_oom", "second_oom", "other_errors",
                                       "free_errors")) and rf.get("sync_rc") == "CUDA_SUCCESS"
    summary.add("oom", ok, "shim: %s rounds, %s OOM, %s ms/round; refill %s x 4 GiB, %s OOM" % (
        lp.get("rounds") if lp else "-", lp.get("oom") if lp else "-",
        fmt_ms(num(lp, "per_round_ms")) if lp else "-", rf.get("chunks") if rf else "-",
        rf.get("second_oom") if rf else "-"))


def conform_after(r):
    """The behaviour after a case, short: 'ok' when all three calls succeeded."""
    after = r.get("after") if r else None
    if after is None:
        return "-"
    if after == "alloc:SUCCESS,launch:SUCCESS,sync:SUCCESS":
        return "ok"
    if after == "pending":
        return "pending (the follow-up died)"
    return after


def report_conform(res, summary):
    cases = []
    for r in res.of("conform"):
        if r.get("case") not in cases:
            cases.append(r.get("case"))
    # Runs that printed nothing still count, under their own name.
    for (check, _mode, id_) in res.runs:
        if check == "conform" and id_ not in cases:
            cases.append(id_)
    rows, diffs, by_design, gaps = [], [], [], []
    for case in cases:
        codes, afters = [], []
        for mode in ("none", "shim"):
            r = res.one("conform", mode=mode, case=case)
            if r:
                codes.append(r.get("rc"))
            else:
                run_id = case.split(".")[0] if case.endswith(".end_capture") else case
                codes.append("NO_RESULT(%s)" % res.run_status("conform", mode, run_id))
            afters.append(conform_after(r))
        if codes[0] == codes[1] and afters[0] == afters[1]:
            verdict = "MATCH"
        elif codes[0] == codes[1]:
            verdict = "DIFF (afterwards)"
            diffs.append(case)
        elif CONFORM_BY_DESIGN.get(case) == codes[1]:
            verdict = "DIFF (by design)"
            by_design.append(case)
        elif codes[0].startswith("NO_RESULT(signal") and codes[1].startswith("CUDA_ERROR_"):
            # The driver dereferences a handle it already freed and crashes;
            # the shim still knows the handle was released and says so.
            verdict = "DIFF (driver crashes)"
            by_design.append(case)
        elif case in CONFORM_KNOWN_GAPS:
            verdict = "DIFF (known shim gap)"
            diffs.append(case)
            gaps.append(case)
        else:
            verdict = "DIFF"
            diffs.append(case)
        rows.append((case, codes[0], codes[1], afters[0], afters[1], verdict))
    table("conformance: return codes on bad input, and the behaviour afterwards "
          "(alloc, launch, cuCtxSynchronize; ok = all succeeded)",
          ("case", "no shim", "shim", "after (no shim)", "after (shim)", ""), rows)
    if by_design:
        print("DIFF (by design): while a capture is live the shim only queues the release, "
              "so the capture stays valid (DESIGN.md, graph capture)")
        print("DIFF (driver crashes): the driver itself dies on the second release of that "
              "handle; the shim answers with an error code instead")
    for case in gaps:
        print("DIFF (known shim gap): %s: %s" % (case, CONFORM_KNOWN_GAPS[case]))
    matched = len(cases) - len(diffs) - len(by_design)
    summary.add("conformance", bool(cases) and not diffs, "%d/%d cases match%s%s" % (
        matched, len(cases), ("; %d differ by design or where the driver crashes" % len(by_design)) if by_design else "",
        ("; DIFF: " + names(diffs, 4)) if diffs else ""))


def report_capture(res, summary):
    rows = []
    for mode in ("none", "shim"):
        r = res.one("capture", mode=mode)
        if r:
            rows.append((MODE_TITLES[mode], r.get("rounds"), r.get("captured"), r.get("graphs_ok"),
                         r.get("capture_launch_errors"), r.get("free_errors"),
                         r.get("free_host_errors"), r.get("first_end_rc"),
                         r.get("first_free_rc")))
        else:
            rows.append((MODE_TITLES[mode], res.run_status("capture", mode, "capture"),
                         "-", "-", "-", "-", "-", "-", "-"))
    table("capture: global-mode capture on thread 1 while thread 2 frees",
          ("mode", "rounds", "captured", "graphs ran ok", "launch errors", "cuMemFree errors",
           "cuMemFreeHost errors", "first EndCapture error", "first free error"), rows)
    s = res.one("capture", mode="shim")
    n = res.one("capture", mode="none")
    ok = bool(s) and s.get("rounds") == s.get("captured") == s.get("graphs_ok") and all(
        s.get(k) == "0" for k in ("capture_launch_errors", "free_errors", "free_host_errors",
                                  "leftover_errors")) and \
        res.run_status("capture", "shim", "capture") == "ok"
    summary.add("capture", ok, "shim: %s/%s captures ended, %s graphs ran; no shim: %s/%s (%s)" % (
        s.get("captured") if s else "-", s.get("rounds") if s else "-",
        s.get("graphs_ok") if s else "-", n.get("captured") if n else "-",
        n.get("rounds") if n else "-", n.get("first_end_rc") if n else "no result"))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    res = Results(sys.argv[1])
    summary = Summary()
    for step in (report_build, report_doors, report_stall, report_hazards, report_faults,
                 report_deadlock, report_oom, report_conform, report_capture):
        try:
            step(res, summary)
        except Exception as e:  # one broken table must not hide the others
            summary.add(step.__name__.replace("report_", ""), False,
                        "report error: %s: %s" % (type(e).__name__, e))
    summary.print()
    sys.exit(1 if summary.failed() else 0)


if __name__ == "__main__":
    main()
