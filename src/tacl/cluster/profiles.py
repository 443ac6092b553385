"""`tacl profiles install`: make `snakemake --profile slurm`, `--profile pbs` and `--profile workstation` work
by name.

Snakemake looks a profile given by name up in the working directory, then in the user's config folder
(`$XDG_CONFIG_HOME/snakemake`, i.e. `~/.config/snakemake`), then in the site's; this repository keeps its
profiles under `profiles/`. Installing links `~/.config/snakemake/NAME` to `profiles/NAME` of the checkout
the command is run from (else the one the environment was installed from, and it says so), a link, so
that a `git pull` updates the profile too. A profile of that name that is not such a link is
the user's own: it is left alone, with a message saying so.

Without the package's dependencies (e.g. on a login node before the environment exists):
`PYTHONPATH=src python3 -m tacl.cluster.profiles` (what `make profiles` runs).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tacl.runtime.io import InputError

REPO = Path(__file__).resolve().parents[3]  # the checkout this package was installed from
NAMES = ("slurm", "pbs", "workstation")


def checkout_of(start: Path) -> Path | None:
    """The checkout of this workflow that holds `start` (itself or a folder above it: one with
    workflow/Snakefile and profiles/), or None."""
    for folder in (start, *start.parents):
        if (folder / "workflow" / "Snakefile").is_file() and (folder / "profiles").is_dir():
            return folder
    return None


def which_checkout(cwd: Path) -> tuple[Path, str]:
    """The checkout whose profiles to link, and why: the one the command is run from, else (run from
    elsewhere) the one the environment was installed from."""
    here = checkout_of(cwd.resolve())
    if here is not None:
        return here, "the checkout you are in"
    return REPO, (f"the checkout this environment was installed from ({cwd} is in no checkout of this "
                  "workflow; run the command from the checkout whose profiles you want)")


def user_config_dir() -> Path:
    """Snakemake's user config folder: where it looks for a profile given by name after the working
    directory (Snakemake's own answer; without Snakemake, e.g. `make profiles` before the environment
    exists, the same rule as on Linux: $XDG_CONFIG_HOME/snakemake or ~/.config/snakemake)."""
    try:
        from snakemake.common import get_appdirs
    except ImportError:
        base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
        return Path(base) / "snakemake"
    return Path(get_appdirs().user_config_dir)


def install_profiles(repo: Path = REPO, names: tuple[str, ...] = NAMES,
                     config_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """Link each profile into Snakemake's user config folder. Returns (done, refused): one line each; a
    refused name (an existing profile that is not this checkout's link) is left as it was."""
    config_dir = config_dir or user_config_dir()
    done, refused = [], []
    for name in names:
        source = (repo / "profiles" / name).resolve()
        if not (source / "config.yaml").is_file():
            raise InputError(f"{source}/config.yaml: no such profile in this checkout")
        target = config_dir / name
        if target.is_symlink() and target.resolve() == source:
            done.append(f"{target} -> {source} (already there)")
            continue
        if target.is_symlink() or target.exists():
            what = f"a link to {os.readlink(target)}" if target.is_symlink() else "a profile of your own"
            refused.append(f"{target} is {what}: left alone, so `--profile {name}` uses it, not this "
                           f"checkout's; use `--profile {repo / 'profiles' / name}`, or remove it and install again")
            continue
        config_dir.mkdir(parents=True, exist_ok=True)
        tmp = config_dir / f".{name}.tmp-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(source, target_is_directory=True)
        tmp.rename(target)  # (atomic: a concurrent install sees the link or nothing)
        done.append(f"{target} -> {source}")
    return done, refused


def main() -> int:
    repo, why = which_checkout(Path.cwd())
    print(f"profiles of {repo}: {why}")
    try:
        done, refused = install_profiles(repo)
    except InputError as e:
        print(f"tacl: error: {e}", file=sys.stderr)
        return 2
    for line in done:
        print(f"profile installed: {line}")
    for line in refused:
        print(f"profile NOT installed: {line}", file=sys.stderr)
    if not refused:
        print("`snakemake --profile " + "` / `snakemake --profile ".join(NAMES) + f"` now use {repo / 'profiles'}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
