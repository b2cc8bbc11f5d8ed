"""Kill and resume under mpiexec -n 3: a job killed mid-epoch, then killed
again while writing a backup, ends (after two restarts) with exactly the
weights and optimizer state of a run that was never interrupted. And on 2
ranks, ddlrun --max-restarts does the restart itself."""

import glob
import os
import re

import numpy as np

SCRIPT = "resume_job.py"


def launch(launcher, mode, backup_dir, nprocs=3, options=()):
    # through ddlrun, which names the rank that died first
    return launcher.ddlrun(nprocs, SCRIPT, mode, str(backup_dir),
                           options=["--no-prefix-output", *options],
                           env={"DDL_PEER_TIMEOUT_S": "5"}, timeout=300)


def lines(proc, what):
    """{rank: match} of `RANK r <what ...>` lines."""
    found = {}
    for m in re.finditer(rf"^RANK (\d) {what}$", proc.stdout, re.MULTILINE):
        found[int(m.group(1))] = m
    return found


def output(proc):
    return f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def finals(proc):
    final = lines(proc, r"FINAL digest=(\w+) iterations=(\d+)")
    assert set(final) == {0, 1, 2}, output(proc)
    assert len({m.group(2) for m in final.values()}) == 1, "ranks ended with different state"
    return final[0].group(2), int(final[0].group(3))


def restored(proc):
    found = lines(proc, r"RESTORED epoch=(\d+) iterations=(\d+)")
    assert set(found) == {0, 1, 2}, output(proc)
    assert len({m.groups()[1:] for m in found.values()}) == 1, output(proc)
    return tuple(int(g) for g in found[0].groups()[1:])


def backups(directory):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory, "*")) +
                  glob.glob(os.path.join(directory, ".partial-*")))


def test_killed_twice_then_resumed_equals_uninterrupted(launcher, tmp_path):
    steps_per_epoch, epochs = 4, 3
    straight = launch(launcher, "full", tmp_path / "straight" / "backup")
    assert straight.returncode == 0, output(straight)
    assert restored(straight) == (0, 0)
    digest, iterations = finals(straight)
    assert iterations == steps_per_epoch * epochs
    assert backups(tmp_path / "straight" / "backup") == ["epoch-000002", "epoch-000003"]

    # Run 1: rank 1 is killed in the middle of epoch 2; only epoch 1 was backed up.
    directory = tmp_path / "interrupted" / "backup"
    killed = launch(launcher, "kill", directory)
    assert killed.returncode != 0
    died = re.search(r"^RANK 1 killed at ([\d.]+)$", killed.stdout, re.MULTILINE)
    assert died and "FINAL" not in killed.stdout, output(killed)
    assert killed.ended - float(died.group(1)) < 30, "the job outlived its dead rank by 30 s"
    assert re.search(r"^ddlrun: the job failed \(exit code \d+\); rank 1 on \S+ ended first",
                     killed.stderr, re.MULTILINE), output(killed)
    assert backups(directory) == ["epoch-000001"]

    # Run 2: resumes after epoch 1, trains epoch 2, and rank 0 dies while
    # writing its backup: a half-written partial directory is left behind.
    killed_saving = launch(launcher, "killsave", directory)
    assert killed_saving.returncode != 0
    assert restored(killed_saving) == (1, steps_per_epoch), output(killed_saving)
    assert "RANK 0 killed while saving" in killed_saving.stdout, output(killed_saving)
    left = backups(directory)
    assert left[0] == ".partial-epoch-000002-" + left[0].rsplit("-", 1)[1] and \
        left[1:] == ["epoch-000001"], left

    # Run 3: the partial backup is ignored (then removed), epoch 1's loads.
    resumed = launch(launcher, "full", directory)
    assert resumed.returncode == 0, output(resumed)
    assert restored(resumed) == (1, steps_per_epoch)
    assert "removes" in resumed.stderr and ".partial-epoch-000002" in resumed.stderr
    assert finals(resumed) == (digest, iterations)
    assert backups(directory) == ["epoch-000002", "epoch-000003"]
    a = np.load(tmp_path / "straight" / "full.final.npz")
    b = np.load(tmp_path / "interrupted" / "full.final.npz")
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])

    # A finished run restarted trains nothing more and keeps its state.
    again = launch(launcher, "full", directory)
    assert again.returncode == 0, output(again)
    assert restored(again) == (epochs, steps_per_epoch * epochs)
    assert finals(again) == (digest, iterations)


def test_ddlrun_max_restarts_resumes_a_killed_job_to_the_uninterrupted_weights(launcher,
                                                                                  tmp_path):
    straight = launch(launcher, "full", tmp_path / "straight" / "backup", nprocs=2)
    assert straight.returncode == 0, output(straight)
    # Rank 1 kills itself mid-way through epoch 2 of the first attempt only;
    # ddlrun relaunches, and the job resumes from the backup of epoch 1.
    restarted = launch(launcher, "killonce", tmp_path / "restarted" / "backup", nprocs=2,
                       options=["--max-restarts", "1", "--restart-delay-s", "1"])
    assert restarted.returncode == 0, output(restarted)
    assert re.search(r"^RANK 1 killed at [\d.]+$", restarted.stdout, re.MULTILINE), \
        output(restarted)
    assert re.search(r"^ddlrun: restart 1 of at most 1: attempt 1 failed \(exit code \d+\); "
                     r"rank 1 on \S+ ended first \(killed by SIGKILL\).*Time lost: [\d.]+ s",
                     restarted.stderr, re.MULTILINE), output(restarted)
    resumed = re.findall(r"^RANK (\d) RESTORED epoch=(\d+) iterations=(\d+)$",
                         restarted.stdout, re.MULTILINE)
    assert sorted(resumed) == [("0", "0", "0"), ("0", "1", "4"), ("1", "0", "0"),
                               ("1", "1", "4")], output(restarted)
    assert lines(restarted, r"FINAL digest=(\w+) iterations=(\d+)")[0].group(1) == \
        lines(straight, r"FINAL digest=(\w+) iterations=(\d+)")[0].group(1)
    a = np.load(tmp_path / "straight" / "full.final.npz")
    b = np.load(tmp_path / "restarted" / "killonce.final.npz")
    assert a.files == b.files
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
