"""Registry benchmark: `dvc push` + `modelmint pull` of a 1 GiB artifact against a `cp` of the same bytes.

Run: .venv/bin/python benchmarks/bench_dvc.py [--gib 1.0] [--keep]
A temp git + DVC project with a local remote (a directory on the same disk); the artifact is a GGUF of random
weights. Timed, each after the page cache holds the file (so the ratio is CPU and copy work, not the disk):
  cp        `cp` of the GGUF to a new file
  commit    `dvc commit` of its stage (md5 + copy into the DVC cache)   [registration, for reference]
  push      `dvc push` of the stage to the remote
  pull      `modelmint pull` in a fresh clone: `dvc fetch`, then copy + sha256 check into place
Prints the ratios and writes benchmarks/results/dvc.json. Target: (push + pull) / cp ≤ 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3, help="timed repetitions of cp, push and pull (best is kept)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="bench-dvc-", dir=os.environ.get("TMPDIR")))
    env_dir = scratch / "env"
    home = env_dir / "modelmint"
    home.mkdir(parents=True)
    from pipelines.core.settings import Settings

    real_home = Settings.from_env().home
    for shared in ("toolchains", "models"):
        (home / shared).symlink_to(real_home / shared)
    (env_dir / "gitconfig").write_text("[user]\n\tname = bench\n\temail = bench@modelmint.invalid\n")
    os.environ.update({
        "MODELMINT_HOME": str(home), "DVC_NO_ANALYTICS": "1", "DVC_SITE_CACHE_DIR": str(env_dir / "dvc-site"),
        "DVC_GLOBAL_CONFIG_DIR": str(env_dir / "dvc-g"), "DVC_SYSTEM_CONFIG_DIR": str(env_dir / "dvc-s"),
        "GIT_CONFIG_GLOBAL": str(env_dir / "gitconfig"), "GIT_CONFIG_NOSYSTEM": "1",
    })
    from registry_env import Repo, candidate, git, make_repo, write_gguf

    from pipelines.registry.pull import pull
    from pipelines.registry.register import place, publish, track
    from pipelines.store import dvcrepo

    try:
        repo = make_repo(scratch)
        settings = repo.settings()
        c = candidate(settings, scratch / "build")
        big = c.files[0]
        write_gguf(big, seed=7, mib=args.gib * 1024)
        from pipelines.core.fsutil import sha256_file

        c = type(c)(**{**c.__dict__, "sha256": sha256_file(big), "size_bytes": big.stat().st_size})
        size = big.stat().st_size
        print(f"artifact: {size / (1 << 30):.2f} GiB at {big}")

        cps = []
        for i in range(args.repeat):
            dst = scratch / f"cp-{i}.gguf"
            cps.append(_time(lambda d=dst: subprocess.run(["cp", str(big), str(d)], check=True)))
            dst.unlink()
        files = place(settings, c)
        commit_s = _time(lambda: track(settings, c, files))
        tracked = track(settings, c, files)
        pushes = []
        for _ in range(args.repeat):
            shutil.rmtree(repo.remote)
            repo.remote.mkdir()
            pushes.append(_time(lambda: dvcrepo.push(settings, c.stage)))
        publish(settings, c, tracked, push=False)  # the manifest (the push above already happened)
        repo.commit_all("register")
        pulls = []
        for i in range(args.repeat):
            clone_dir = scratch / f"clone-{i}"
            git(scratch, "clone", "-q", str(repo.root), clone_dir.name)
            clone = Repo(clone_dir, repo.remote, repo.work)
            # a fresh clone on a machine that never had the blob: empty DVC cache
            pulls.append(_time(lambda cl=clone: pull(cl.settings(), c.ref, ollama=False)))
            shutil.rmtree(clone_dir)
        cp, push_s, pull_s = min(cps), min(pushes), min(pulls)
        results = {
            "bytes": size, "cp_s": round(cp, 3), "commit_s": round(commit_s, 3), "push_s": round(push_s, 3),
            "pull_s": round(pull_s, 3), "push_over_cp": round(push_s / cp, 2), "pull_over_cp": round(pull_s / cp, 2),
            "push_plus_pull_over_cp": round((push_s + pull_s) / cp, 2), "target": 3.0,
            "cp_gib_s": round(size / (1 << 30) / cp, 2),
        }
        print(f"cp {cp:.2f} s ({results['cp_gib_s']} GiB/s) · commit {commit_s:.2f} s · push {push_s:.2f} s · "
              f"pull {pull_s:.2f} s")
        print(f"(push + pull) / cp = {results['push_plus_pull_over_cp']} (target ≤ 3); "
              f"push/cp {results['push_over_cp']}, pull/cp {results['pull_over_cp']}")
        out = ROOT / "benchmarks" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "dvc.json").write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
