"""Mutation testing of the numerical core: run mutmut, then write the per-folder report.

    python tools/mutation.py run [--max-children N] [--stop-after SECONDS] [--retry-undetected]
                                 [--retry-timeouts] [--only FOLDER,...] [--sample N] [--retest NAME,...]
    python tools/mutation.py report
    python tools/mutation.py save


Run from the repository root (mutmut reads ``[tool.mutmut]`` in pyproject.toml and works in
``mutants/``). ``run`` resumes: mutants that already have a result keep it, so a run stopped by
``--stop-after`` (or Ctrl-C) continues where it stopped, and a run after a source change retests only
the mutants of the functions that changed; ``--retry-undetected`` also retests every mutant that
survived or had no test, so that tests added since count; ``--retry-timeouts`` retests every mutant that
timed out (mutmut's limit is partly wall-clock time: a run paused with SIGSTOP, or sharing the machine
with other work, times out mutants that would have been killed or survived; do not pause a run);
``--only`` limits the run to some folders (their mutants without a result, by name); ``--sample N`` tests
N mutants drawn uniformly (seeded) from each folder's mutants without a result, so that a folder too large
for one sitting gets an unbiased estimate of its % killed with a 95 % interval before the rest is run;
``--retest NAME,...`` retests the named mutants whatever their verdict (after writing the tests meant to kill
them, without retesting a whole folder's survivors). ``report`` writes
``mutants/mutation-report.md`` (killed / survived / ... and % killed for each folder) and
``mutants/mutation-survivors.txt`` (the diff of every mutant no test killed) and
``docs/development/mutation-survivors.md`` (each survivor's change with the reason it is left, from
``docs/development/mutation-reasons.json``), prints the table and exits 1 when a folder is below the target,
mutants are still unchecked or a survivor has no written reason.

The verdicts outlive ``mutants/``: ``run`` ends by saving them (and ``save`` does on its own) into
``docs/development/mutation-results.json`` (per source file, its functions' hashes and the exit code of
every mutant with a result), and ``run`` starts by restoring them into ``mutants/``, so a run on a fresh
clone or another machine tests only the mutants without a verdict; mutmut drops the verdicts of every
function whose code changed since (its hash differs).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

TARGET_PERCENT = 85.0
PACKAGE = Path("src/mtlflow")
#: the saved verdicts, committed with the code they judged
SAVED_RESULTS = Path("docs/development/mutation-results.json")
#: why each surviving mutant is equivalent or accepted (mutant name -> one line), written by whoever read it
SURVIVOR_REASONS = Path("docs/development/mutation-reasons.json")
#: the survivors with their change and that reason, written by ``report``
SURVIVOR_PAGE = Path("docs/development/mutation-survivors.md")
# The folders the target applies to, each with the source files it covers.
FOLDERS = {
    "methods": PACKAGE / "methods",
    "numerics": PACKAGE / "core" / "numerics.py",
    "teleport": PACKAGE / "teleport",
    "pareto": PACKAGE / "pareto",
    "grad_engine": PACKAGE / "grad_engine",
    "scoring": PACKAGE / "metrics" / "scoring.py",
}
# mutmut's statuses, as its stats module names them, sorted into detected / not detected. A mutant
# that makes the tests time out or crash the interpreter is detected; one that no test calls
# ("no tests") is not.
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}
UNDETECTED = {"survived", "no tests", "suspicious"}
COLUMNS = ["killed", "timeout", "segfault", "survived", "no tests", "suspicious", "skipped", "not checked"]


def folder_of(source: Path) -> str | None:
    for name, root in FOLDERS.items():
        if source == root or root in source.parents:
            return name
    return None


def load_results(mutants_dir: Path) -> dict[str, dict[str, tuple[Path, int | None]]]:
    """{folder: {mutant name: (source path, exit code)}} from mutmut's ``*.py.meta`` files."""
    results: dict[str, dict[str, tuple[Path, int | None]]] = {name: {} for name in FOLDERS}
    for meta in sorted(mutants_dir.rglob("*.py.meta")):
        source = meta.relative_to(mutants_dir).with_suffix("")
        folder = folder_of(source)
        if folder is None:
            continue
        for mutant, exit_code in json.loads(meta.read_text())["exit_code_by_key"].items():
            results[folder][mutant] = (source, exit_code)
    return results


def summarise(results: dict[str, dict[str, tuple[Path, int | None]]]) -> tuple[str, list[str]]:
    """The Markdown table and the list of problems (folders below target, unchecked mutants)."""
    from mutmut.stats import status_by_exit_code

    lines = ["| folder | mutants | " + " | ".join(COLUMNS)
             + " | % killed | % killed, timeouts not counted | 95 % interval of the folder's % killed |",
             "| --- " * (len(COLUMNS) + 5) + "|"]
    problems = []
    for folder, mutants in results.items():
        counts = Counter(status_by_exit_code[code] for _, code in mutants.values())
        detected = sum(counts[s] for s in DETECTED)
        judged = detected + sum(counts[s] for s in UNDETECTED)
        percent = 100.0 * detected / judged if judged else float("nan")
        # a mutant can time out because it slows a test down, not only because it loops: shown apart
        strict = 100.0 * (detected - counts["timeout"]) / judged if judged else float("nan")
        # exact when every mutant is judged; otherwise valid only if the judged ones are a uniform sample (--sample)
        low, high = wilson_interval(detected, judged) if counts["not checked"] else (percent, percent)
        lines.append(f"| {folder} | {len(mutants)} | " + " | ".join(str(counts[c]) for c in COLUMNS)
                     + f" | {percent:.1f} | {strict:.1f} | {low:.1f}–{high:.1f} |")
        if not mutants:
            problems.append(f"{folder}: no mutants found (was `mutmut run` started from the repository root?)")
        elif counts["not checked"]:
            problems.append(f"{folder}: {counts['not checked']} mutants not checked yet (rerun to continue)")
        if judged and percent < TARGET_PERCENT:
            problems.append(f"{folder}: {percent:.1f} % killed, below the {TARGET_PERCENT:.0f} % target")
    return "\n".join(lines), problems


def write_survivors(results: dict[str, dict[str, tuple[Path, int | None]]], out: Path) -> dict[str, list[tuple[str, str]]]:
    """Write the diff of every undetected mutant into ``out``; returns {folder: [(name, diff)]}."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    survivors: dict[str, list[tuple[str, str]]] = {}
    with out.open("w") as f:
        for folder, mutants in results.items():
            survivors[folder] = []
            for mutant, (source, code) in sorted(mutants.items()):
                status = status_by_exit_code[code]
                if status not in UNDETECTED:
                    continue
                try:
                    diff = get_diff_for_mutant(mutant, path=source)
                except Exception as error:  # a diff that cannot be rebuilt must not hide the others
                    diff = f"(diff unavailable: {error})"
                survivors[folder].append((mutant, diff))
                f.write(f"## {folder} :: {mutant} ({status})\n{diff}\n\n")
    return survivors


def changed_lines(diff: str) -> list[str]:
    """The removed and added lines of a unified diff (without its file headers)."""
    return [line for line in diff.splitlines()
            if line[:1] in "-+" and not line.startswith(("---", "+++"))]


def write_survivor_page(survivors: dict[str, list[tuple[str, str]]], reasons: dict[str, str], out: Path) -> list[str]:
    """The Markdown page of every survivor (per folder: its change and why it is left); returns the survivors
    that have no reason in ``reasons``."""
    missing = []
    lines = ["# Surviving mutants", "",
             f"Written by `tools/mutation.py report` from the verdicts in `{SAVED_RESULTS.name}` and the reasons in "
             f"`{SURVIVOR_REASONS.name}`: every mutant no test detects, the lines it changes, and why it is "
             "equivalent (no input tells it apart) or accepted. The classes are described in "
             "[Mutation testing](mutation-testing.md).", ""]
    for folder, entries in survivors.items():
        lines += [f"## {folder} ({len(entries)})", ""]
        for name, diff in entries:
            reason = reasons.get(name)
            if reason is None:
                missing.append(name)
                reason = "**not read yet**"
            lines += [f"- `{name}`: {reason}", "", "    ```diff"]
            lines += ["    " + line for line in changed_lines(diff)] + ["    ```", ""]
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(out)
    return missing


def report(mutants_dir: Path) -> int:
    if not mutants_dir.is_dir():
        print(f"error: no {mutants_dir}/ here: run `tools/mutation.py run` first (it restores the saved verdicts)",
              file=sys.stderr)
        return 2
    results = load_results(mutants_dir)
    table, problems = summarise(results)
    (mutants_dir / "mutation-report.md").write_text(
        f"Mutation testing of the numerical core (target {TARGET_PERCENT:.0f} % killed per folder; "
        "% killed = (killed + timeout + segfault) / (those + survived + no tests + suspicious)).\n\n"
        + table + "\n")
    survivors = write_survivors(results, mutants_dir / "mutation-survivors.txt")
    reasons = json.loads(SURVIVOR_REASONS.read_text()) if SURVIVOR_REASONS.is_file() else {}
    missing = write_survivor_page(survivors, reasons, SURVIVOR_PAGE)
    print(table)
    print(f"{sum(map(len, survivors.values()))} undetected mutants listed in {mutants_dir / 'mutation-survivors.txt'} "
          f"and {SURVIVOR_PAGE}")
    if missing:
        problems.append(f"{len(missing)} survivors without a reason in {SURVIVOR_REASONS} (read them, then add "
                        f"one line each), e.g. {missing[0]}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def forget(mutants_dir: Path, folders: list[str], statuses: set[str]) -> list[str]:
    """Clear the results of the mutants of ``folders`` whose status is in ``statuses`` so that ``mutmut run``
    tests them again; returns their names."""
    from mutmut.stats import status_by_exit_code

    forgotten = []
    for meta_path in mutants_dir.rglob("*.py.meta"):
        if folder_of(meta_path.relative_to(mutants_dir).with_suffix("")) not in folders:
            continue
        meta = json.loads(meta_path.read_text())
        codes = meta["exit_code_by_key"]
        for mutant, code in codes.items():
            if code is not None and status_by_exit_code[code] in statuses:
                codes[mutant] = None
                forgotten.append(mutant)
        meta_path.write_text(json.dumps(meta, indent=4))
    return forgotten


def forget_named(mutants_dir: Path, names: set[str]) -> list[str]:
    """Clear the results of the mutants named ``names`` so that ``mutmut run`` tests them again; returns the
    names found."""
    forgotten = []
    for meta_path in mutants_dir.rglob("*.py.meta"):
        meta = json.loads(meta_path.read_text())
        codes = meta["exit_code_by_key"]
        found = names.intersection(codes)
        if found:
            for mutant in found:
                codes[mutant] = None
            forgotten += sorted(found)
            meta_path.write_text(json.dumps(meta, indent=4))
    return forgotten


def generate_mutants(max_children: int) -> None:
    """Write ``mutants/`` (the mutated sources and each file's ``.meta`` listing its mutants) without testing
    any: mutmut's first phase, so that the mutants of a folder can be named and sampled before the run."""
    from mutmut.__main__ import create_mutants
    from mutmut.mutation.trampoline import set_mutant_under_test
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths

    set_mutant_under_test("mutant_generation")
    Path("mutants").mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    create_mutants(max_children)
    set_mutant_under_test(None)


def sample_pending(names: list[str], size: int, seed: int = 0) -> list[str]:
    """``size`` of ``names`` drawn uniformly without replacement (all when fewer), the same draw for the same
    names and seed: a uniform sample makes the killed fraction among the judged mutants an unbiased estimate
    of the folder's, which is what the report's interval assumes."""
    ordered = sorted(names)
    return sorted(random.Random(seed).sample(ordered, size)) if size < len(ordered) else ordered


def wilson_interval(detected: int, judged: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval, in percent, of the detected fraction when ``judged`` mutants are a uniform
    sample of the folder's."""
    if judged == 0:
        return 0.0, 100.0
    p = detected / judged
    centre = (p + z * z / (2 * judged)) / (1 + z * z / judged)
    half = z * math.sqrt(p * (1 - p) / judged + z * z / (4 * judged * judged)) / (1 + z * z / judged)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)


def pending_in(folders: list[str], mutants_dir: Path) -> list[str]:
    """Names of the mutants of ``folders`` that have no result yet; a module pattern per folder when
    no earlier run left results to read the names from."""
    results = load_results(mutants_dir)
    names = [name for folder in folders for name, (_, code) in results[folder].items() if code is None]
    unknown = [folder for folder in folders if not results[folder]]
    return names + [f"mtlflow.{folder}.*" if folder != "scoring" else "mtlflow.metrics.scoring.*" for folder in unknown]


#: what mutmut copies unmutated into its working copy (the tests, and ``also_copy`` of pyproject.toml)
COPIED = ("tests", "components", "pipelines", "examples", "docs")


def drop_stale_copies(mutants_dir: Path) -> None:
    """Remove mutmut's copies of the tests and the other unmutated folders: it copies files again on every
    run but never deletes one, so a test file deleted or renamed in the repository would otherwise keep
    running (against code it no longer matches) and fail the stats collection."""
    for name in COPIED:
        shutil.rmtree(mutants_dir / name, ignore_errors=True)


def save_results(mutants_dir: Path, saved: Path) -> int:
    """Write the verdicts of ``mutants_dir`` into ``saved`` (merged over what it holds for other files);
    returns the number of mutants with a verdict."""
    files = json.loads(saved.read_text())["files"] if saved.is_file() else {}
    for meta_path in sorted(mutants_dir.rglob("*.py.meta")):
        source = meta_path.relative_to(mutants_dir).with_suffix("")
        if folder_of(source) is None:
            continue
        meta = json.loads(meta_path.read_text())
        files[source.as_posix()] = {
            "hash_by_function_name": dict(sorted(meta["hash_by_function_name"].items())),
            "exit_code_by_key": {k: v for k, v in sorted(meta["exit_code_by_key"].items()) if v is not None}}
    saved.parent.mkdir(parents=True, exist_ok=True)
    partial = saved.with_name(saved.name + ".partial")
    partial.write_text(json.dumps({"files": dict(sorted(files.items()))}, indent=1) + "\n")
    partial.replace(saved)
    return sum(len(entry["exit_code_by_key"]) for entry in files.values())


def restore_results(mutants_dir: Path, saved: Path) -> int:
    """Give ``mutants_dir`` the saved verdicts of the mutants it has none for; mutmut keeps them for the
    functions whose hash is unchanged when it regenerates the mutants. Returns the number restored."""
    if not saved.is_file():
        return 0
    restored = 0
    for source, entry in json.loads(saved.read_text())["files"].items():
        meta_path = mutants_dir / (source + ".meta")
        meta = (json.loads(meta_path.read_text()) if meta_path.is_file() else
                {"exit_code_by_key": {}, "hash_by_function_name": {}, "type_check_error_by_key": {},
                 "durations_by_key": {}, "estimated_durations_by_key": {}})
        if meta["hash_by_function_name"] and meta["hash_by_function_name"] != entry["hash_by_function_name"]:
            continue  # mutants generated from other code: their own results stand
        meta["hash_by_function_name"] = entry["hash_by_function_name"]
        for mutant, code in entry["exit_code_by_key"].items():
            if meta["exit_code_by_key"].get(mutant) is None:
                meta["exit_code_by_key"][mutant] = code
                restored += 1
        meta_path.parent.mkdir(parents=True, exist_ok=True)
        meta_path.write_text(json.dumps(meta, indent=4))
        # an older mutant file makes mutmut regenerate it from the source and merge the restored verdicts
        mutant_file = mutants_dir / source
        if mutant_file.is_file():
            os.utime(mutant_file, (0, 0))
    return restored


def run(max_children: int, stop_after: float | None, retry_undetected: bool, only: list[str],
        retry_timeouts: bool = False, sample: int | None = None, retest: list[str] | None = None) -> int:
    print(f"restored {restore_results(Path('mutants'), SAVED_RESULTS)} saved verdicts")
    if sample is not None or only or retest:
        # names every mutant: the verdicts restored into a fresh mutants/ name only the judged ones, so the
        # retests, the draw and a folder's never-judged mutants can be listed only after this
        generate_mutants(max_children)
    retests: list[str] = []
    if retest:
        # every name checked before any verdict is cleared: a typo leaves mutants/ as it was
        known = {name for mutants in load_results(Path("mutants")).values() for name in mutants}
        unknown = sorted(set(retest) - known)
        if unknown:
            print(f"error: no mutant named {', '.join(unknown)}; mutants/mutation-survivors.txt (written by "
                  "`tools/mutation.py report`) lists the survivors' names", file=sys.stderr)
            return 2
        retests += forget_named(Path("mutants"), set(retest))
        print(f"retesting {len(retests)} named mutants")
    if retry_undetected:
        undetected = forget(Path("mutants"), only or list(FOLDERS), UNDETECTED)
        retests += undetected
        print(f"retesting {len(undetected)} undetected mutants")
    if retry_timeouts:
        timed_out = forget(Path("mutants"), only or list(FOLDERS), {"timeout"})
        retests += timed_out
        print(f"retesting {len(timed_out)} timed-out mutants")
    names: list[str] = []
    if sample is not None:
        # the retests, and a draw from the mutants never judged: together with the earlier draws still a
        # uniform sample of each folder
        results = load_results(Path("mutants"))
        retesting = set(retests)
        drawn = [name for folder in only or list(FOLDERS)
                 for name in sample_pending([n for n, (_, code) in results[folder].items()
                                             if code is None and n not in retesting], sample)]
        names = retests + drawn
        print(f"testing a uniform draw of {len(drawn)} mutants without a verdict")
    elif only:
        names = pending_in(only, Path("mutants"))
        names += [name for name in retests if name not in set(names)]  # named mutants of other folders
    elif retest:
        names = retests
    if sample is not None or only or retest:
        if not names:
            print(f"nothing left to test in {', '.join(only or FOLDERS)}")
            return report(Path("mutants"))
    drop_stale_copies(Path("mutants"))
    # One thread per worker: the workers already fill the cores, and torch's pools must not oversubscribe.
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # its own process group, so that stopping it also stops its forkserver and workers
    process = subprocess.Popen([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names],
                               env=env, start_new_session=True)
    try:
        process.wait(timeout=stop_after)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):  # --stop-after, or Ctrl-C (not sent to its group)
        # mutmut writes each verdict as it comes, so stopping it loses only the mutants being tested. SIGTERM,
        # not SIGINT: a run started in the background by a non-interactive shell ignores SIGINT.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        print("stopped; run again to continue", file=sys.stderr)
    print(f"saved {save_results(Path('mutants'), SAVED_RESULTS)} verdicts in {SAVED_RESULTS}")
    return report(Path("mutants"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="run (or resume) mutmut, then report")
    run_parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1,
                            help="parallel mutant workers (default: all cores)")
    run_parser.add_argument("--stop-after", type=float, default=None, metavar="SECONDS",
                            help="stop mutmut after this long, keeping the results so far")
    run_parser.add_argument("--retry-undetected", action="store_true",
                            help="retest the mutants that survived or had no test in earlier runs")
    run_parser.add_argument("--retry-timeouts", action="store_true",
                            help="retest the mutants that timed out in earlier runs (a paused run or a loaded "
                                 "machine times mutants out: mutmut's limit is wall-clock time)")
    run_parser.add_argument("--only", type=lambda v: v.split(","), default=[], metavar="FOLDER,...",
                            help=f"test only these of {', '.join(FOLDERS)}")
    run_parser.add_argument("--sample", type=int, default=None, metavar="N",
                            help="test N mutants drawn uniformly from each folder's mutants without a verdict, and "
                                 "with --retry-undetected/--retry-timeouts only those retests besides (the report's "
                                 "interval then estimates the folder's %% killed)")
    run_parser.add_argument("--retest", type=lambda v: v.split(","), default=[], metavar="NAME,...",
                            help="retest these mutants (as mutmut names them), whatever their verdict")
    sub.add_parser("report", help="write the report of the results so far")
    sub.add_parser("save", help=f"save the verdicts of mutants/ into {SAVED_RESULTS} (run does it when it ends)")
    args = parser.parse_args(argv)
    if not Path("pyproject.toml").is_file():
        print("error: run tools/mutation.py from the repository root (pyproject.toml not found)", file=sys.stderr)
        return 2
    if args.command == "run":
        unknown = sorted(set(args.only) - set(FOLDERS))
        if unknown:
            print(f"error: unknown folder {', '.join(unknown)}; choose from {', '.join(FOLDERS)}", file=sys.stderr)
            return 2
        if args.sample is not None and args.sample < 0:
            print(f"error: --sample must be a number of mutants (0 or more), got {args.sample}", file=sys.stderr)
            return 2
        malformed = [name for name in args.retest if "__mutmut_" not in name]
        if malformed:
            print(f"error: --retest takes mutant names such as mtlflow.pareto.front.x_dominates__mutmut_3, got "
                  f"{', '.join(malformed)}", file=sys.stderr)
            return 2
        return run(args.max_children, args.stop_after, args.retry_undetected, args.only, args.retry_timeouts,
                   args.sample, args.retest)
    if args.command == "save":
        print(f"saved {save_results(Path('mutants'), SAVED_RESULTS)} verdicts in {SAVED_RESULTS}")
        return 0
    return report(Path("mutants"))


if __name__ == "__main__":
    sys.exit(main())
