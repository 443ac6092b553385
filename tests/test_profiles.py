"""`snakemake --profile slurm` / `--profile pbs` by bare name after `tacl profiles install` (docs/clusters.md)."""

import os
import subprocess
import sys

from conftest import REPO, fresh_clone, silent_schedulers
from tacl.cluster.profiles import install_profiles


def test_install_links_is_harmless_twice_and_leaves_a_foreign_profile_alone(tmp_path):
    config_dir = tmp_path / "snakemake"
    done, refused = install_profiles(REPO, ("slurm", "pbs"), config_dir)
    assert refused == [] and len(done) == 2
    assert (config_dir / "slurm").resolve() == REPO / "profiles" / "slurm"
    assert (config_dir / "pbs" / "config.yaml").read_text() == (REPO / "profiles/pbs/config.yaml").read_text()
    done, refused = install_profiles(REPO, ("slurm", "pbs"), config_dir)
    assert refused == [] and all(line.endswith("(already there)") for line in done)

    (config_dir / "slurm").unlink()
    (config_dir / "slurm").mkdir()
    (config_dir / "slurm" / "config.yaml").write_text("executor: slurm\njobs: 3\n")  # the user's own
    (config_dir / "pbs").unlink()
    (config_dir / "pbs").symlink_to(tmp_path)  # a link somewhere else
    done, refused = install_profiles(REPO, ("slurm", "pbs"), config_dir)
    assert done == [] and len(refused) == 2
    assert "slurm is a profile of your own: left alone" in refused[0] and "--profile " in refused[0]
    assert f"pbs is a link to {tmp_path}: left alone" in refused[1]
    assert (config_dir / "slurm" / "config.yaml").read_text() == "executor: slurm\njobs: 3\n"
    assert os.readlink(config_dir / "pbs") == str(tmp_path)


def test_named_profiles_dry_run_from_a_fresh_clone(tmp_path):
    """In a fresh clone, with HOME a new folder: `tacl profiles install`, then `snakemake --profile slurm -n`
    and `--profile pbs -n` on the demo config, typed by bare name, from the clone's root."""
    clone = fresh_clone(tmp_path / "user")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "TACL_SHARED_DATA")}
    # the variables the README has a user export; a login node whose scheduler does not answer (a dry run asks
    # it: here, stand-ins that fail, so that the test cluster of CI is not the one asked)
    env.update(HOME=str(home), PYTHONPATH=str(clone / "src"), PATH=silent_schedulers(tmp_path / "bin"),
               TACL_SLURM_ACCOUNT="p123", TACL_SLURM_CPU_PARTITION="cpu", TACL_SLURM_GPU_PARTITION="gpu",
               TACL_PBS_CPU_QUEUE="cpu", TACL_PBS_GPU_QUEUE="gpu")

    def run(*cmd):
        return subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True, timeout=300)

    installed = run(sys.executable, "-m", "tacl", "profiles", "install")
    assert installed.returncode == 0, installed.stderr
    assert (home / ".config" / "snakemake" / "slurm").resolve() == clone / "profiles" / "slurm"
    for name in ("slurm", "pbs"):
        proc = run("snakemake", "--profile", name, "-n", "--configfile", "examples/demo/config.yaml",
                   "--replace-workflow-config")
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-3000:]
        assert "pretrain_chunk" in log and "This was a dry-run" in log
    again = run(sys.executable, "-m", "tacl", "profiles", "install")
    assert again.returncode == 0 and "already there" in again.stdout
    (home / ".config" / "snakemake" / "pbs").unlink()
    (home / ".config" / "snakemake" / "pbs").mkdir()
    (home / ".config" / "snakemake" / "pbs" / "config.yaml").write_text("jobs: 1\n")
    refused = run(sys.executable, "-m", "tacl", "profiles", "install")
    assert refused.returncode == 1 and "pbs is a profile of your own: left alone" in refused.stderr


def test_install_links_the_checkout_it_is_run_from(tmp_path):
    """An environment installed from one checkout, run in another: the profiles of the one it is run from
    (from any folder in it); run from no checkout, the installed one's, saying so."""
    from tacl.cluster.profiles import which_checkout

    other = tmp_path / "other"
    (other / "workflow").mkdir(parents=True)
    (other / "workflow" / "Snakefile").write_text("")
    (other / "profiles" / "slurm").mkdir(parents=True)
    (other / "results" / "deep").mkdir(parents=True)
    assert which_checkout(other / "results" / "deep") == (other, "the checkout you are in")
    repo, why = which_checkout(tmp_path)
    assert repo == REPO and "the checkout this environment was installed from" in why and str(tmp_path) in why
