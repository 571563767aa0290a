#!/usr/bin/env python3
"""report.py - tables and the summary of the real-GPU checks.

usage: report.py RESULTS_FILE

RESULTS_FILE is what scripts/gpu-check.sh collects: one line per program
run and per result line of a program,

    RUN check=<check> mode=<mode> id=<id> rc=<exit status|skipped> secs=<s>
    RESULT <name> check=<check> mode=<mode> id=<id> key=value ...

(mode: none = no shim, passthrough = shim with CUDEFER_ENABLE=0, shim =
shim enabled, shim-defaults = shim with every CUDEFER_* variable unset).
Prints one table per check, then the summary table: one line per check with
PASS or FAIL and its key numbers (SIMULATED where the run was over the test
driver and the check needs real kernels, SKIP or SKIPPED where it did not
run, PARTIAL where the informational libs check could not run some
library, alike with and without cudefer). Exit status 0 when no check
failed, 1 otherwise.
"""
import math
import os
import statistics
import sys
from collections import defaultdict

GOAL_MS = 0.05  # what a release or a launch may cost with the shim (check 2)

MODES = ("none", "passthrough", "shim")
MODE_TITLES = {"none": "no shim", "passthrough": "ENABLE=0", "shim": "shim",
               "shim-defaults": "shim (defaults)"}

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
# The conformance cases' codes measured on the H200, and cudefer's answers
# by design, come with the RESULT lines (fields h200 and by_design), from the
# case table tests/conformance/cases.h.

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
                    "capture": ("capture",), "registered": ("registered",),
                    "hidden-wait": ("hidden-wait",), "teardown-race": ("teardown-race",),
                    "oom-concurrent": ("oom-concurrent",), "capture-ptsz": ("capture-ptsz",),
                    "green": ("green",), "primary-unseen": ("primary-unseen",),
                    "sticky": ("sticky",), "quiet": ("quiet",), "libs": ("libs",),
                    "contexts": ("contexts",), "inherit": ("inherit",)}


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

    def add(self, check, ok, numbers, status=None):
        """status: instead of PASS/FAIL, e.g. SIMULATED (over the test
        driver, where kernels do not run: neither passed nor failed)."""
        if self.picked is not None and check not in self.picked:
            self.lines.append((check, "SKIP", "not run (GPU_CHECK_ONLY)"))
            return
        self.lines.append((check, status or ("PASS" if ok else "FAIL"), numbers))

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
        # launch: only the other thread's launch is judged (the release waits
        # for the work before it by design: cudefer's cuMemHostUnregister)
        "judge": rows[-1].get("judge", "both"),
    }


def report_stall(res, summary):
    """The goal: with the shim, the caller's median under GOAL_MS, and the
    other thread's launch blocked under GOAL_MS: its median time less the
    median time of the same launch when nothing is released (the row
    STALL_BASELINE), which is the launch's own cost. A row with judge=launch
    (cuMemHostUnregister, which waits for the work submitted before it) is
    judged by the launch alone."""
    rows, over, invalid, by_launch = [], [], [], []
    worst_rel = worst_lau = 0.0
    alone = stall_stats(res, "shim", STALL_BASELINE)
    alone_ms = alone["launch"] if alone else 0.0
    if alone:
        row = ["(no release: the launch alone)"]
        for mode in MODES:
            s = stall_stats(res, mode, STALL_BASELINE)
            row += [fmt_ms(s["release"]) if s else "-", fmt_ms(s["launch"]) if s else "-"]
        rows.append(row + [fmt_ms(alone["release_max"]), fmt_ms(alone["launch_max"]),
                           alone["rcs"], "-"])
    else:
        invalid.append("the launch alone")
    for release in STALL_RELEASES:
        row = [release]
        for mode in MODES:
            s = stall_stats(res, mode, release)
            row += [fmt_ms(s["release"]) if s else "-", fmt_ms(s["launch"]) if s else "-"]
        s = stall_stats(res, "shim", release)
        if s:
            launch_only = s["judge"] == "launch"
            row += [fmt_ms(s["release_max"]), fmt_ms(s["launch_max"]), s["rcs"],
                    "launch" if launch_only else "both"]
            if launch_only:
                by_launch.append("%s (caller %s ms)" % (release, fmt_ms(s["release"])))
            else:
                worst_rel = max(worst_rel, s["release"])
            worst_lau = max(worst_lau, s["launch"] - alone_ms)
            caller_ok = launch_only or s["release"] < GOAL_MS
            if not (s["rc_ok"] and s["valid"]):
                invalid.append(release)
            elif not (caller_ok and s["launch"] - alone_ms < GOAL_MS):
                over.append(release)
        else:
            row += ["-", "-", "-", "-"]
            invalid.append(release)
        rows.append(row)
    header = ["release (1 s kernel on another stream)"]
    for mode in MODES:
        header += ["%s: caller ms" % MODE_TITLES[mode], "%s: launch ms" % MODE_TITLES[mode]]
    header += ["shim max caller", "shim max launch", "shim rc", "judged by"]
    table("stall: median ms the release blocked its caller / another thread's launch", header,
          rows)
    base = stall_stats(res, "none", STALL_RELEASES[0])
    run = res.run_status("stall", "shim", "stall")
    setup = res.one("stall_setup", mode="shim")
    if setup and setup.get("shim_loaded") != "1":
        run = "cudefer was not loaded"
    notes = []
    if by_launch:
        notes.append("judged by the launch alone (waits for the work before it): " +
                     names(by_launch))
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
    reports on stderr how many queued releases it keeps for the context's
    destruction, which frees them."""
    r = res.one("hazard", mode="shim", stream="unsafe", memory="device") or {}
    run = res.run_status("hazards", "shim", "unsafe:device")
    d = res.one("hazard_dropped", mode="shim")
    dropped = int(d.get("dropped", "0")) if d else 0
    queued = int(r.get("queued", "0"))
    table("faults: a kernel fault with releases queued (the unsafe control under cudefer)",
          ("mode", "queued before", "cuCtxSynchronize", "cuMemFree after",
           "reported kept for teardown", "program"),
          [("cudefer", r.get("queued", "-"), r.get("sync_rc", "-"), r.get("after_rc", "-"),
            dropped if d else "-", run)])
    fault_rc = "CUDA_ERROR_ILLEGAL_ADDRESS"
    ok = (bool(r) and run == "ok" and r.get("sync_rc") == fault_rc and
          r.get("after_rc") == fault_rc and queued >= 1 and dropped >= queued)
    summary.add("faults", ok, "cuCtxSynchronize %s, cuMemFree after it %s; %s queued, %d "
                "reported kept for teardown; program %s" % (
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
    """Every case's code and behaviour afterwards, without and with the shim.
    A difference counts as intended where the case table
    (tests/conformance/cases.h, fields h200 and by_design of the RESULT
    lines) gives the shim's code: by design, or where the driver crashes."""
    cases = []
    for r in res.of("conform"):
        if r.get("case") not in cases:
            cases.append(r.get("case"))
    # Runs that printed nothing still count, under their own name.
    for (check, _mode, id_) in res.runs:
        if check == "conform" and id_ not in cases:
            cases.append(id_)
    rows, diffs, by_design, drifted = [], [], [], []
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
        known = res.one("conform", case=case) or {}
        h200, design = known.get("h200", "-"), known.get("by_design", "-")
        driver_crashed = codes[0].startswith("NO_RESULT(signal")
        if codes[0] == codes[1] and afters[0] == afters[1]:
            verdict = "MATCH"
        elif codes[0] == codes[1]:
            verdict = "DIFF (afterwards)"
            diffs.append(case)
        elif design not in ("-", "crash") and codes[1] == design:
            verdict = "DIFF (driver crashes)" if driver_crashed else "DIFF (by design)"
            by_design.append(case)
        else:
            verdict = "DIFF"
            diffs.append(case)
        if h200 not in ("-", "crash") and codes[0] != h200 and not driver_crashed:
            drifted.append("%s: %s (table: %s)" % (case, codes[0], h200))
        rows.append((case, codes[0], codes[1], h200, afters[0], afters[1], verdict))
    table("conformance: return codes on bad input, and the behaviour afterwards "
          "(alloc, launch, cuCtxSynchronize; ok = all succeeded)",
          ("case", "no shim", "shim", "H200 (table)", "after (no shim)", "after (shim)", ""),
          rows)
    if by_design:
        print("DIFF (by design): while a capture is live the shim only queues the release, "
              "so the capture stays valid")
        print("DIFF (driver crashes): the driver itself dies on the second release of that "
              "handle; the shim answers with an error code instead")
    for d in drifted:
        print("NOTE: the driver alone now answers differently from the case table "
              "(tests/conformance/cases.h): " + d)
    matched = len(cases) - len(diffs) - len(by_design)
    summary.add("conformance", bool(cases) and not diffs, "%d/%d cases match%s%s%s" % (
        matched, len(cases),
        ("; %d differ by design or where the driver crashes" % len(by_design)) if by_design
        else "",
        ("; DIFF: " + names(diffs, 4)) if diffs else "",
        ("; %d differ from the H200 table without the shim" % len(drifted)) if drifted else ""))


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


# ---- checks 8-16: each program without cudefer (none) and with it (shim) -------

REGISTERED_LAUNCH_MS = 1.0     # the other thread's launch during the unregister
HIDDEN_WAIT_MS = 100.0         # an allocation while the flag kernel waits
HIDDEN_WAIT_CASES = ("pinned", "device-cache", "second-context", "other-context-sync",
                     "register-over", "oom-kind", "oom-managed", "oom-other")
# The measured call's answer where it is not CUDA_SUCCESS: oom-kind asks for
# more than the device has (oom-managed too).
HIDDEN_WAIT_RC = {"oom-kind": "CUDA_ERROR_OUT_OF_MEMORY",
                  "oom-managed": "CUDA_ERROR_OUT_OF_MEMORY"}
# oom-other: an allocation short of memory waits up to 100 ms for other
# contexts' work (shim/engine/reclaim.c, OOM_FAR_NS), then gives the memory
# back; what it must not do is wait for the kernel that waits for it.
HIDDEN_WAIT_OOM_MS = 1000.0
CAPTURE_PTSZ_HELD_MIB = 256.0  # at most cudefer's device cache
GREEN_HELD_MARGIN_MIB = 64.0   # above what the driver alone leaves
QUIET_FRAMEWORKS = ("torch", "jax", "cupy")
QUIET_REL_TOL = 1e-6


def simulated(*rows):
    """Over the test driver (a smoke run of the script): kernels do not run."""
    return any(r and r.get("simulated") == "1" for r in rows)


def verdict_of(problems, r, run_status, sim=False):
    """'ok', 'simulated', or what failed."""
    if r is None:
        return "FAIL (no result: %s)" % run_status
    if sim:
        return "simulated"
    if run_status != "ok":
        return "FAIL (program: %s)" % run_status
    return "FAIL (%s)" % ", ".join(problems) if problems else "ok"


def add_verdicts(summary, check, verdicts, numbers):
    """One summary line from a check's verdicts: FAIL if any failed,
    SIMULATED if every verdict is, PASS otherwise."""
    failed = [v for v in verdicts if v.startswith("FAIL")]
    if verdicts and not failed and all(v == "simulated" for v in verdicts):
        summary.add(check, True, numbers + " (test driver: kernels simulated)", "SIMULATED")
    else:
        summary.add(check, bool(verdicts) and not failed, numbers + (
            "; " + "; ".join(sorted(set(failed))) if failed else ""))


def is_success(r, *keys):
    return all(r.get(k) == "CUDA_SUCCESS" for k in keys)


def report_registered(res, summary):
    rows, verdicts = [], []
    for mode in ("none", "shim"):
        r = res.one("registered", mode=mode)
        run = res.run_status("registered", mode, "registered")
        if r is None:
            rows.append((MODE_TITLES[mode], run, "-", "-", "-", "-", "-", "-", "-"))
            if mode == "shim":
                verdicts.append(verdict_of([], None, run))
            continue
        problems = []
        if mode == "shim":
            first = num(r, "first_left_ms", 0.0)
            second = num(r, "second_end_ms", 0.0)
            if not is_success(r, "unregister_rc", "sync_rc", "launch_rc"):
                problems.append("a call failed")
            if r.get("writer_running") != "1":
                problems.append("the writer had finished")
            if r.get("overwritten_words") != "0":
                problems.append("the GPU wrote after the unregister")
            if num(r, "launch_ms", 1e9) >= REGISTERED_LAUNCH_MS:
                problems.append("the launch blocked")
            if num(r, "unregister_ms", 1e9) >= (first + second) / 2:
                problems.append("the unregister waited for the second kernel")
            f = res.one("registered_freed", mode=mode) or {}
            if not is_success(f, "alloc_host_rc", "managed_rc"):
                problems.append("an allocation over the freed buffer failed (%s, %s)" % (
                    f.get("alloc_host_rc", "-"), f.get("managed_rc", "-")))
            verdicts.append(verdict_of(problems, r, run, simulated(r)))
        rows.append((MODE_TITLES[mode], r.get("unregister_rc"), fmt_ms(num(r, "unregister_ms")),
                     r.get("first_left_ms"), r.get("second_end_ms"), r.get("overwritten_words"),
                     fmt_ms(num(r, "launch_ms")), r.get("sync_rc"),
                     verdicts[-1] if mode == "shim" else "recorded"))
    table("registered: cuMemHostUnregister while a kernel writes the buffer; another thread "
          "launches a 500 ms kernel 100 ms in",
          ("mode", "unregister rc", "unregister ms", "first kernel left ms",
           "second kernel ends ms", "words written after", "launch ms", "cuCtxSynchronize",
           "verdict"), rows)
    s = res.one("registered", mode="shim") or {}
    n = res.one("registered", mode="none") or {}
    sf = res.one("registered_freed", mode="shim") or {}
    add_verdicts(summary, "registered", verdicts,
                 "shim: unregister %s ms (first kernel left %s ms), launch %s ms (goal < %s), "
                 "%s words written after; no shim: unregister %s ms, launch %s ms; after a "
                 "freed registered buffer, shim: cuMemAllocHost %s (same address %s), "
                 "cuMemAllocManaged %s (same address %s)" % (
                     fmt_ms(num(s, "unregister_ms")), s.get("first_left_ms", "-"),
                     fmt_ms(num(s, "launch_ms")), REGISTERED_LAUNCH_MS,
                     s.get("overwritten_words", "-"), fmt_ms(num(n, "unregister_ms")),
                     fmt_ms(num(n, "launch_ms")), sf.get("alloc_host_rc", "-"),
                     sf.get("alloc_host_same", "-"), sf.get("managed_rc", "-"),
                     sf.get("managed_same", "-")))


def mode_rows(res, result, check, program, problems_of, cells_of, verdicts,
              modes=("none", "shim"), needs_kernels=True):
    """A row per mode of a program's RESULT line named result: the mode, how
    the program ended, cells_of(r) ({} without a result) and the verdict,
    which for the shim goes to verdicts ('recorded' in the other modes).
    problems_of(r) lists what failed; needs_kernels: a run over the test
    driver is 'simulated'."""
    rows = []
    for mode in modes:
        r = res.one(result, mode=mode)
        run = res.run_status(check, mode, program)
        v = verdict_of(problems_of(r) if r else [], r, run, needs_kernels and simulated(r))
        if mode == "shim":
            verdicts.append(v)
        rows.append((MODE_TITLES[mode], run) + tuple(cells_of(r or {})) +
                    (v if mode == "shim" else "recorded",))
    return rows


def case_table(res, result, check, cases, judge, cells):
    """The rows and cudefer's verdicts of a program run per case without and
    with cudefer: judge(r, case) lists what failed in a run with cudefer,
    cells(r, case) the row's cells between the mode and the verdict."""
    rows, verdicts = [], []
    for case in cases:
        for mode in ("none", "shim"):
            r = res.one(result, mode=mode, case=case)
            run = res.run_status(check, mode, case)
            if r is None:
                rows.append((case, MODE_TITLES[mode], run) + ("-",) * len(cells({}, case)))
                if mode == "shim":
                    verdicts.append(verdict_of([], None, run))
                continue
            v = "recorded"
            if mode == "shim":
                v = verdict_of(judge(r, case), r, run, simulated(r))
                verdicts.append(v)
            rows.append((case, MODE_TITLES[mode]) + tuple(cells(r, case)) + (v,))
    return rows, verdicts


def worst_of(res, result, cases, key):
    """The largest key of the runs with cudefer of those cases (0 if none)."""
    return max([num(res.one(result, mode="shim", case=c) or {}, key, 0.0) for c in cases] or
               [0.0])


def report_hidden_wait(res, summary):
    def judge(r, case):
        problems = []
        if (r.get("alloc_rc") != HIDDEN_WAIT_RC.get(case, "CUDA_SUCCESS")
                or not is_success(r, "sync_rc")):
            problems.append("a call failed")
        if r.get("kernel_waiting") != "1":
            problems.append("the flag kernel was not running")
        if r.get("watchdog_fired") != "0":
            problems.append("the allocation waited for the kernel")
        elif num(r, "alloc_ms", 1e9) >= (HIDDEN_WAIT_OOM_MS if case == "oom-other"
                                         else HIDDEN_WAIT_MS):
            problems.append("the allocation took %s ms" % fmt_ms(num(r, "alloc_ms")))
        return problems

    def cells(r, case):
        return (r.get("alloc_rc"), fmt_ms(num(r, "alloc_ms")), r.get("kernel_waiting"),
                r.get("watchdog_fired"))

    rows, verdicts = case_table(res, "hidden_wait", "hidden-wait", HIDDEN_WAIT_CASES, judge,
                                cells)
    worst = worst_of(res, "hidden_wait", HIDDEN_WAIT_CASES[:-1], "alloc_ms")
    oom = worst_of(res, "hidden_wait", ("oom-other",), "alloc_ms")
    table("hidden-wait: an allocation while a kernel waits for the allocating thread",
          ("case", "mode", "alloc rc", "alloc ms", "kernel waiting", "watchdog fired",
           "verdict"), rows)
    add_verdicts(summary, "hidden-wait", verdicts,
                 "shim: slowest allocation %s ms (goal: < %s ms, before the watchdog); short "
                 "of memory beside another context's waiting kernel %s ms (goal: < %s ms)" % (
                     fmt_ms(worst), HIDDEN_WAIT_MS, fmt_ms(oom), HIDDEN_WAIT_OOM_MS))


CONTEXTS_CASES = ("ctx_managed", "ctx_managed_sync", "ctx_hostmap", "ctx_hostmap_sync")
CONTEXTS_WRITER_MS = 400.0  # tests/gpu/multigpu.c


def report_contexts(res, summary):
    def judge(r, case):
        problems = []
        if r.get("release_rc") != "CUDA_SUCCESS":
            problems.append("the release failed")
        if r.get("writer_running") != "1":
            problems.append("the writer had finished")
        if r.get("fault") != "0":
            problems.append("the writer faulted")
        if num(r, "release_ms", 1e9) >= CONTEXTS_WRITER_MS / 2:
            problems.append("the release waited")
        if case.endswith("_sync") and r.get("writer_after_sync0") != "1":
            problems.append("the synchronisation waited for the other context")
        return problems

    def cells(r, case):
        sync0 = num(r, "sync0_ms", -1.0)
        return (r.get("release_rc"), fmt_ms(num(r, "release_ms")),
                fmt_ms(sync0) if sync0 >= 0 else "-",
                r.get("writer_after_sync0") if sync0 >= 0 else "-",
                r.get("sync1_rc"), r.get("fault"))

    rows, verdicts = case_table(res, "multigpu", "contexts", CONTEXTS_CASES, judge, cells)
    worst_sync = worst_of(res, "multigpu", [c for c in CONTEXTS_CASES if c.endswith("_sync")],
                          "sync0_ms")
    table("contexts: a second context of the GPU writes memory of the primary context "
          "(400 ms) while the primary context releases it (and synchronises, _sync)",
          ("case", "mode", "release rc", "release ms", "sync ms", "writer after sync",
           "writer's context", "fault", "verdict"), rows)
    add_verdicts(summary, "contexts", verdicts,
                 "shim: 0 faults wanted, the primary context's synchronisation took at most "
                 "%s ms with the writer still running" % fmt_ms(worst_sync))


def teardown_race_problems(r):
    if r.get("b_errors") != "0":
        return ["%s of B's calls failed, first %s" % (r.get("b_errors"), r.get("first_error"))]
    return []


def report_teardown_race(res, summary):
    verdicts = []
    rows = mode_rows(
        res, "teardown_race", "teardown-race", "teardown_race", teardown_race_problems,
        lambda r: tuple(r.get(k, "-") for k in ("rounds", "b_calls", "b_errors", "first_error",
                                                "a_oom", "a_other", "a_flushes")),
        verdicts, needs_kernels=False)
    table("teardown-race: contexts made and destroyed while another thread flushes",
          ("mode", "program", "rounds", "B calls", "B errors", "first error", "A OOM",
           "A other", "A flushes", "verdict"), rows)
    s = res.one("teardown_race", mode="shim") or {}
    add_verdicts(summary, "teardown-race", verdicts,
                 "shim: %s rounds, %s calls of B, %s failed; %s flushes of A" % (
                     s.get("rounds", "-"), s.get("b_calls", "-"), s.get("b_errors", "-"),
                     s.get("a_flushes", "-")))


def flush_phase_problems(r):
    problems = []
    if r.get("alloc_rc") != "CUDA_SUCCESS":
        problems.append("the 150 MiB allocation failed")
    if not is_success(r, "a_free_host_rc", "sync_rc"):
        problems.append("a call failed")
    if r.get("kernel_running") != "1":
        problems.append("the kernel had finished")
    return problems


def capture_phase_problems(r):
    problems = []
    if r.get("alloc_rc") != "CUDA_SUCCESS":
        problems.append("the 250 MiB allocation during the capture failed")
    if not is_success(r, "begin_rc", "end_rc"):
        problems.append("the capture failed or was invalidated")
    if r.get("kernel_running") != "1":
        problems.append("the 300 ms kernel had finished")
    return problems


def report_oom_concurrent(res, summary):
    verdicts = []
    rows = mode_rows(
        res, "oom_concurrent", "oom-concurrent", "oom_concurrent", flush_phase_problems,
        lambda r: (r.get("free_after_fill_mib", "-"), r.get("alloc_rc", "-"),
                   fmt_ms(num(r, "alloc_ms")), r.get("kernel_running", "-"),
                   r.get("a_flushed", "-")), verdicts)
    table("oom-concurrent: an allocation that needs freed memory while another thread's flush "
          "waits for a 1.5 s kernel",
          ("mode", "program", "free after fill MiB", "alloc rc", "alloc ms", "kernel running",
           "A flushed", "verdict"), rows)
    rows = mode_rows(
        res, "oom_capture", "oom-concurrent", "oom_concurrent", capture_phase_problems,
        lambda r: (r.get("alloc_rc", "-"), fmt_ms(num(r, "alloc_ms")),
                   r.get("kernel_running", "-"), r.get("end_rc", "-")), verdicts)
    table("oom-concurrent, capture: the same need while another thread's global capture is "
          "live (the block freed behind a 300 ms kernel)",
          ("mode", "program", "alloc rc", "alloc ms", "kernel running", "capture end rc",
           "verdict"), rows)
    s = res.one("oom_concurrent", mode="shim") or {}
    n = res.one("oom_concurrent", mode="none") or {}
    sc = res.one("oom_capture", mode="shim") or {}
    add_verdicts(summary, "oom-concurrent", verdicts,
                 "shim: cuMemAlloc(150 MiB) %s in %s ms; no shim: %s; during a capture: "
                 "cuMemAlloc(250 MiB) %s in %s ms, capture end %s" % (
                     s.get("alloc_rc", "-"), fmt_ms(num(s, "alloc_ms")), n.get("alloc_rc", "-"),
                     sc.get("alloc_rc", "-"), fmt_ms(num(sc, "alloc_ms")), sc.get("end_rc", "-")))


def capture_ptsz_problems(r):
    problems = []
    if not is_success(r, "begin_rc", "launch_rc", "end_rc", "sync_rc"):
        problems.append("a call failed")
    if not is_success(r, "two_ctx_begin_rc"):
        problems.append("two contexts' per-thread captures: %s" % r.get("two_ctx_begin_rc"))
    if not is_success(r, "two_ctx_end_rc"):
        problems.append("context A's capture ended with %s" % r.get("two_ctx_end_rc"))
    if r.get("loop_errors") != "0":
        problems.append("%s allocations or frees failed" % r.get("loop_errors"))
    if num(r, "held_mib", 1e9) > CAPTURE_PTSZ_HELD_MIB:
        problems.append("%s MiB held" % r.get("held_mib"))
    return problems


def report_capture_ptsz(res, summary):
    verdicts = []
    rows = mode_rows(
        res, "capture_ptsz", "capture-ptsz", "capture_ptsz", capture_ptsz_problems,
        lambda r: tuple(r.get(k, "-") for k in ("begin_rc", "end_rc", "loop_errors",
                                                "held_mib", "settle_ms", "two_ctx_end_rc")),
        verdicts, needs_kernels=False)
    table("capture-ptsz: a capture on the per-thread stream (_ptsz), then 8 x 512 MiB "
          "alloc/free: memory held after cuCtxSynchronize; then per-thread captures in two "
          "contexts on one thread: the first context's capture end",
          ("mode", "program", "begin", "end", "loop errors", "held MiB", "settle ms",
           "two contexts: A's end", "verdict"), rows)
    s = res.one("capture_ptsz", mode="shim") or {}
    n = res.one("capture_ptsz", mode="none") or {}
    add_verdicts(summary, "capture-ptsz", verdicts, "held: shim %s MiB (goal <= %.0f), "
                 "no shim %s MiB" % (s.get("held_mib", "-"), CAPTURE_PTSZ_HELD_MIB,
                                     n.get("held_mib", "-")))


def report_green(res, summary):
    rows, verdicts, notes = [], [], []
    held = {}
    for mode in ("none", "shim"):
        run = res.run_status("green", mode, "green")
        setup = res.one("green_setup", mode=mode)
        mem = res.one("green_memory", mode=mode)
        if setup:
            v = "simulated" if simulated(setup) else "FAIL (set-up)"
            rows.append((MODE_TITLES[mode], "-", "set-up: %s %s" % (setup.get("step"),
                                                                  setup.get("rc")),
                         "-", "-", "-", v))
            notes.append("%s: no green context (%s: %s)" % (MODE_TITLES[mode],
                                                           setup.get("step"), setup.get("rc")))
            if mode == "shim":
                verdicts.append(v)
            continue
        ctx_rows = res.of("green", mode=mode)
        problems = []
        for r in ctx_rows:
            bad = [k for k in ("alloc_rc", "free_rc", "alloc_host_rc", "free_host_rc",
                               "release_rc", "sync_rc", "destroy_rc")
                   if r.get(k) != "CUDA_SUCCESS"]
            if bad:
                problems.append("context %s: %s" % (r.get("ctx"), ",".join(bad)))
            if r.get("fault") != "0":
                problems.append("context %s faulted" % r.get("ctx"))
            if r.get("writer_running") != "1" and not simulated(mem):
                problems.append("context %s: the writer had finished" % r.get("ctx"))
            rows.append((MODE_TITLES[mode], r.get("ctx"), ",".join(bad) or "all succeeded",
                         r.get("writer_running"), r.get("fault"), "-", ""))
        if len(ctx_rows) != 3:
            problems.append("%d green contexts reported" % len(ctx_rows))
        if mem:
            held[mode] = num(mem, "held_mib", 1e9)
            rows.append((MODE_TITLES[mode], "end", "cuCtxSynchronize %s" % mem.get("sync_rc"),
                         "-", "-", mem.get("held_mib"), ""))
        if mode == "shim":
            base = max(held.get("none", 0.0), 0.0)
            if mem and held["shim"] > base + GREEN_HELD_MARGIN_MIB:
                problems.append("%s MiB held" % mem.get("held_mib"))
            verdicts.append(verdict_of(problems, mem, run, simulated(mem)))
            rows[-1] = rows[-1][:-1] + (verdicts[-1],)
    table("green: releases in three green contexts under a green kernel, then memory in use "
          "above the start",
          ("mode", "context", "calls", "writer running", "fault", "held MiB", "verdict"), rows)
    for n in notes:
        print("NOTE: " + n)
    shown = {m: "%.0f" % held[m] if m in held else "-" for m in ("none", "shim")}
    add_verdicts(summary, "green", verdicts, "held: shim %s MiB, no shim %s MiB (goal: at most "
                 "%.0f MiB more)" % (shown["shim"], shown["none"], GREEN_HELD_MARGIN_MIB))


PRIMARY_FIELDS = ("retain_rc", "reset_rc", "retain2_rc", "alloc_rc", "free_host_rc",
                  "release_rc", "state_rc", "active", "free_rc", "alloc2_rc", "launch_rc",
                  "sync_rc")


def differences(n, s, keys):
    """The fields of keys that the run with the shim (s) answered otherwise
    than the run without it (n)."""
    if s and n:
        return ["%s %s (driver: %s)" % (k, s.get(k), n.get(k)) for k in keys
                if s.get(k) != n.get(k)]
    return ["no run without the shim"] if s else []


def report_primary_unseen(res, summary):
    rows, verdicts = [], []
    for variant in ("twice", "reset"):
        n = res.one("primary_unseen", mode="none", variant=variant)
        s = res.one("primary_unseen", mode="shim", variant=variant)
        run = res.run_status("primary-unseen", "shim", variant)
        v = verdict_of(differences(n, s, PRIMARY_FIELDS), s, run)
        verdicts.append(v)
        for mode, r in (("none", n), ("shim", s)):
            r = r or {}
            rows.append((variant, MODE_TITLES[mode], r.get("release_rc", "-"),
                         r.get("active", "-"), r.get("free_rc", "-"), r.get("alloc2_rc", "-"),
                         r.get("launch_rc", "-"), r.get("sync_rc", "-"),
                         v if mode == "shim" else "recorded"))
    table("primary-unseen: a release that leaves the primary context alive, then a free, "
          "an allocation, a kernel, cuCtxSynchronize",
          ("variant", "mode", "release", "active", "cuMemFree", "cuMemAlloc", "launch",
           "cuCtxSynchronize", "verdict"), rows)
    add_verdicts(summary, "primary-unseen", verdicts,
                 "%d/2 variants answered as the driver" % sum(v in ("ok", "simulated")
                                                              for v in verdicts))


INHERIT_CASES = (("advise", "managed"), ("prefetch", "managed"), ("attach", "managed"),
                 ("syncmemops", "device"), ("syncmemops", "host"), ("dmabuf", "device"),
                 ("rt_advise", "managed"), ("rt_prefetch", "managed"))


def report_inherit(res, summary):
    rows, verdicts = [], []
    for variant, kind in INHERIT_CASES:
        n = res.one("inherit", mode="none", variant=variant, kind=kind)
        s = res.one("inherit", mode="shim", variant=variant, kind=kind)
        run = res.run_status("inherit", "shim", variant)
        v = verdict_of(differences(n, s, ("set_rc", "before", "after")), s, run)
        verdicts.append(v)
        for mode, r in (("none", n), ("shim", s)):
            r = r or {}
            rows.append(("%s (%s)" % (variant, kind), MODE_TITLES[mode], r.get("set_rc", "-"),
                         r.get("before", "-"), r.get("after", "-"), r.get("same_address", "-"),
                         v if mode == "shim" else "recorded"))
    table("inherit: a block allocated after a release carries nothing set on the released one",
          ("case", "mode", "set", "before the release", "the new block", "same address",
           "verdict"), rows)
    add_verdicts(summary, "inherit", verdicts,
                 "%d/%d cases answered as the driver" % (
                     sum(v in ("ok", "simulated") for v in verdicts), len(verdicts)))


def report_sticky(res, summary):
    n = res.one("sticky", mode="none")

    def problems_of(r):
        problems = []
        # On the H200 a fault leaves the process unable to make a new
        # context (CUDA_ERROR_ILLEGAL_ADDRESS): the registration again is
        # then not tried, the same way in both modes.
        if r.get("fault") != "1" and not simulated(r):
            problems.append("no fault")
        if n:
            problems += ["%s %s (driver: %s)" % (k, r.get(k), n.get(k))
                         for k in ("fault_rc", "destroy_rc", "again_rc", "register_again_rc",
                                   "unregister_again_rc", "destroy_again_rc")
                         if r.get(k) != n.get(k)]
        return problems

    verdicts = []
    rows = mode_rows(
        res, "sticky", "sticky", "sticky", problems_of,
        lambda r: tuple(r.get(k, "-") for k in ("unload_rc", "unregister_rc", "fault_rc",
                                                "destroy_rc", "register_again_rc")),
        verdicts)
    table("sticky: releases queued before a kernel fault, the context destroyed, the range "
          "registered again in a new context",
          ("mode", "program", "unload", "unregister", "fault", "cuCtxDestroy",
           "register again", "verdict"), rows)
    s = res.one("sticky", mode="shim") or {}
    add_verdicts(summary, "sticky", verdicts, "shim: fault %s, cuCtxDestroy %s, registered "
                 "again %s" % (s.get("fault_rc", "-"), s.get("destroy_rc", "-"),
                               s.get("register_again_rc", "-")))


def same_values(a, b):
    """The values of two quiet runs agree (to QUIET_REL_TOL)."""
    try:
        x = [float(v) for v in a.split(",")]
        y = [float(v) for v in b.split(",")]
    except (AttributeError, ValueError):
        return False
    return len(x) == len(y) and all(
        math.isclose(p, q, rel_tol=QUIET_REL_TOL, abs_tol=1e-12) for p, q in zip(x, y))


def report_quiet(res, summary):
    rows, verdicts = [], []
    for fw in QUIET_FRAMEWORKS:
        n = res.one("quiet", mode="none", framework=fw)
        s = res.one("quiet", mode="shim-defaults", framework=fw)
        err = res.one("quiet_stderr", id=fw)
        lines = err.get("cudefer_lines") if err else None
        run = res.run_status("quiet", "shim-defaults", fw)
        if s and s.get("skipped") == "1":
            v = "skipped (%s)" % s.get("reason")
        else:
            problems = []
            if lines != "0":
                problems.append("%s cudefer: lines on stderr" % lines)
            if s and s.get("cudefer") != "1":
                problems.append("cudefer not loaded")
            if not n or n.get("ok") != "1":
                problems.append("no run without cudefer")
            elif s and not same_values(n.get("values"), s.get("values")):
                problems.append("different values")
            v = verdict_of(problems, s, run)
        verdicts.append(v)
        rows.append((fw, res.run_status("quiet", "none", fw), run, lines or "-",
                     (n or {}).get("values", "-")[:40], v))
    table("quiet: frameworks with cudefer at its defaults (no CUDEFER_LOG, no CUDEFER_STATS)",
          ("framework", "no shim", "shim", "cudefer: lines", "values (no shim)", "verdict"), rows)
    counted = [v for v in verdicts if not v.startswith("skipped")]
    skipped = [fw for fw, v in zip(QUIET_FRAMEWORKS, verdicts) if v.startswith("skipped")]
    numbers = "%d/%d frameworks silent with the same values%s" % (
        sum(v == "ok" for v in counted), len(counted),
        ("; skipped: " + ", ".join(skipped)) if skipped else "")
    if not counted:
        summary.add("quiet", True, numbers, "SKIPPED")
    else:
        add_verdicts(summary, "quiet", counted, numbers)


# ---- libs: CUDA libraries' handle and plan destruction (informational) -------

LIBS_IDS = ("cublas", "cublaslt", "cufft", "curand", "cusparse", "cusolver", "cudnn",
            "cudnn-backend", "nccl")
LIBS_MODES = ("none", "shim")
LIBS_MEASURED = ("teardown", "probe")
# A call that blocked longer than this waited for the 1 s kernel (a call
# starts at most 200 ms into it: tests/gpu/libs/libs.h).
LIBS_WAITED_MS = 100.0


def libs_measured(res, lib, mode):
    """The rows of lib's run in mode that timed a call."""
    return [r for r in res.of("libs", mode=mode, id=lib) if r.get("stage") in LIBS_MEASURED]


def libs_why_not(res, lib, mode):
    """Why lib's run in mode timed nothing: its setup line, or how the run ended."""
    setup = [r for r in res.of("libs", mode=mode, id=lib) if r.get("stage") == "setup"]
    if not setup:
        return "program: " + res.run_status("libs", mode, lib)
    r = setup[-1]
    call = r.get("call", "-")
    return r.get("rc", "?") if call == "-" else "%s %s" % (call, r.get("rc", "?"))


def libs_program(res, lib, mode):
    """'ok' when the run printed its libs_done line and exited 0."""
    run = res.run_status("libs", mode, lib)
    if run == "ok" and not res.one("libs_done", mode=mode, id=lib):
        return "no libs_done line"
    return run


def libs_call_rows(res, lib, calls, problems, waited):
    """A row per call: the driver alone, then with cudefer; what differs
    between the two goes into problems, the calls that still waited with
    cudefer into waited."""
    rows = []
    for call in calls:
        n = next((r for r in reversed(libs_measured(res, lib, "none")) if r.get("call") == call),
                 None)
        s = next((r for r in reversed(libs_measured(res, lib, "shim")) if r.get("call") == call),
                 None)
        notes = []
        if (n or s).get("stage") == "probe":
            notes.append("probe, not a library call")
        if n is None or s is None:
            problems.append("%s ran %s only" % (call, "with cudefer" if n is None else
                                                "without cudefer"))
        elif n.get("rc") != s.get("rc"):
            problems.append("%s: rc %s without cudefer, %s with" % (call, n.get("rc"),
                                                                   s.get("rc")))
        for r, who in ((n, "without cudefer"), (s, "with cudefer")):
            if r and r.get("spin_before") != "1" and not simulated(r):
                problems.append("%s: the kernel was not running %s" % (call, who))
                notes.append("kernel not running (%s)" % who)
        if s and num(s, "caller_ms", 0.0) >= LIBS_WAITED_MS:
            waited.append(call)
        rc = (n or s).get("rc", "-") if not (n and s) or n.get("rc") == s.get("rc") else \
            "%s / %s" % (n.get("rc"), s.get("rc"))
        rows.append((lib, call, fmt_ms(num(n, "caller_ms")) if n else "-",
                     fmt_ms(num(n, "launch_ms")) if n else "-",
                     fmt_ms(num(s, "caller_ms")) if s else "-",
                     fmt_ms(num(s, "launch_ms")) if s else "-", rc, "; ".join(notes)))
    return rows


def report_libs(res, summary):
    """Informational: how long each library's destruction blocked its caller
    and another thread's launch, without and with cudefer. PASS when every
    library ran every call in both modes with the same codes; PARTIAL when
    some library could not be built, loaded or set up, in both modes alike;
    FAIL when the two modes differ (a call or a program that ran only
    without cudefer, another code, a kernel that was not running)."""
    rows, unavailable, failed, waited, measured = [], [], [], [], []
    alone = {m: [num(r, "launch_ms") for r in res.of("libs", mode=m)
                 if r.get("stage") == "baseline" and num(r, "launch_ms") is not None]
             for m in LIBS_MODES}
    rows.append(("(none)", "nothing called: the launch alone (median of the programs)", "-",
                 fmt_ms(statistics.median(alone["none"])) if alone["none"] else "-", "-",
                 fmt_ms(statistics.median(alone["shim"])) if alone["shim"] else "-", "-", ""))
    for lib in LIBS_IDS:
        calls = []
        for mode in LIBS_MODES:
            for r in libs_measured(res, lib, mode):
                if r.get("call") not in calls:
                    calls.append(r.get("call"))
        why = {m: libs_why_not(res, lib, m) for m in LIBS_MODES}
        if not calls:
            same = why["none"] == why["shim"]
            rows.append((lib, "-", "-", "-", "-", "-", "-", "not measured: %s" % (
                why["none"] if same else "%s without cudefer, %s with" % (why["none"],
                                                                          why["shim"]))))
            if same:
                unavailable.append("%s (%s)" % (lib, why["none"]))
            else:
                failed.append("%s (set-up: %s without cudefer, %s with)" % (
                    lib, why["none"], why["shim"]))
            continue
        problems = []
        rows += libs_call_rows(res, lib, calls, problems, waited)
        if all(libs_measured(res, lib, m) for m in LIBS_MODES):
            measured.append(lib)
        program = {m: libs_program(res, lib, m) for m in LIBS_MODES}
        if program["shim"] != "ok" and program["none"] == "ok":
            problems.append("program with cudefer: " + program["shim"])
        if problems:
            failed.append("%s (%s)" % (lib, "; ".join(problems)))
    table("libs: ms a library's destruction blocked its caller / another thread's launch, "
          "under a 1 s kernel on another stream",
          ("library", "call", "alone: caller ms", "alone: launch ms", "cudefer: caller ms",
           "cudefer: launch ms", "rc", "note"), rows)

    build_rows = []
    for lib in LIBS_IDS:
        b = res.one("libs_build", id="cudnn" if lib == "cudnn-backend" else lib) or {}
        info = res.one("libs_info", mode="none", id=lib) or res.one("libs_info", id=lib) or {}
        build_rows.append((lib, b.get("status", "-"), b.get("from", "-"), info.get("version", "-"),
                           libs_program(res, lib, "none"), libs_program(res, lib, "shim")))
    table("libs: builds, versions and programs",
          ("library", "build", "library file", "version", "program (alone)",
           "program (cudefer)"), build_rows)

    numbers = "%d/%d libraries measured in both modes; with cudefer still waiting " \
              "(caller >= %.0f ms): %s" % (len(measured), len(LIBS_IDS), LIBS_WAITED_MS,
                                            names(waited, 4) or "none")
    if unavailable:
        numbers += "; unavailable: " + names(unavailable, 9)
    if failed:
        numbers += "; differs: " + names(failed, 4)
    if simulated(*res.of("libs")):
        summary.add("libs", True, numbers + " (test driver: kernels simulated)", "SIMULATED")
    elif failed:
        summary.add("libs", False, numbers)
    else:
        summary.add("libs", True, numbers, "PARTIAL" if unavailable else None)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    res = Results(sys.argv[1])
    summary = Summary()
    for step in (report_build, report_doors, report_stall, report_hazards, report_faults,
                 report_deadlock, report_oom, report_conform, report_capture,
                 report_registered, report_hidden_wait, report_teardown_race,
                 report_oom_concurrent, report_capture_ptsz, report_green,
                 report_primary_unseen, report_inherit, report_sticky, report_contexts,
                 report_quiet, report_libs):
        try:
            step(res, summary)
        except Exception as e:  # one broken table must not hide the others
            summary.add(step.__name__.replace("report_", ""), False,
                        "report error: %s: %s" % (type(e).__name__, e))
    summary.print()
    sys.exit(1 if summary.failed() else 0)


if __name__ == "__main__":
    main()
