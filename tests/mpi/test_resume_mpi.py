"""Kill and resume under ddlrun --max-restarts, with BackupAndRestore(save_freq=5):

- 2 ranks: a tf.data fit stopped and an arrays fit killed (SIGKILL of rank
  1), each at a random batch; the restarted attempt resumes both and ends
  bitwise equal to uninterrupted runs; a finished run restarted trains
  nothing.
- 3 ranks: the same with rank 0 killed in the middle of writing a backup
  (the half-written one is never read, and is removed), and a
  Horovod-style script (sample_index_dataset + DistributedOptimizer)
  stopped at a random batch.
- 3 -> 2 ranks: those 3-rank backups resumed by 2 ranks, twice each: every
  sample of the interrupted epoch trained exactly once (the ranks log the
  sample ids of every step), the two continuations bitwise equal, and a
  warning that the global batch of 9 splits 5 + 4.

The job is tests/mpi/scripts/resume_job.py (54 samples, 6 global batches of 9 an
epoch, 3 epochs; backups every 5 batches, never at an epoch's end)."""

import os
import random
import re

import pytest
from launching import output

SCRIPT = "resume_job.py"
STEPS, GLOBAL, SAVE_FREQ, EPOCHS = 6, 9, 5, 3
SAMPLES = STEPS * GLOBAL


def job_lines(proc, job, what, nprocs):
    """{rank: the groups of <what>} of the `RANK r JOB <job> <what>` lines of every rank."""
    found = {}
    for m in re.finditer(rf"^RANK (\d) JOB {re.escape(job)} {what}$", proc.stdout, re.M):
        found[int(m.group(1))] = m.groups()[1:]
    assert set(found) == set(range(nprocs)), f"{job} {what}:\n{output(proc)}"
    return found


def final(proc, job, nprocs, same_on_every_rank=True):
    """The (digest, iterations) every rank ended with: one pair if every rank
    holds the same state (DDLStrategy), else {rank: pair} (DistributedOptimizer:
    each rank keeps its own BatchNorm statistics)."""
    found = job_lines(proc, job, r"FINAL digest=(\w+) iterations=(\d+)", nprocs)
    if not same_on_every_rank:
        return found
    assert len(set(found.values())) == 1, f"{job}: ranks differ"
    return found[0]


def restored(proc, job, nprocs):
    found = job_lines(proc, job, r"RESTORED epoch=(\d+) step=(\d+) iterations=(\d+) "
                                 r"world=(\d+)", nprocs)
    assert len(set(found.values())) == 1, f"{job}: ranks differ"
    return tuple(int(g) for g in found[0])


def position_of(batches):
    """(epoch, step, iterations) of the backup after `batches` global batches."""
    return batches // STEPS, batches % STEPS, batches


def last_save(batches):
    """The newest save point at or before the start of global batch `batches`."""
    return SAVE_FREQ * (batches // SAVE_FREQ)


def ddlrun(launcher, nprocs, workdir, *plans):
    return launcher.ddlrun(nprocs, SCRIPT, str(workdir), *plans,
                           options=["--no-prefix-output", "--max-restarts", "1",
                                    "--restart-delay-s", "1"],
                           env={"DDL_PEER_TIMEOUT_S": "5"}, timeout=400)


@pytest.fixture(scope="module")
def three_ranks(launcher, tmp_path_factory):
    """The 3-rank job: attempt 0 stops a script fit and a tf.data fit and
    dies writing an arrays backup; attempt 1 copies the backups for the
    2-rank resume, then runs straight and resumed fits."""
    workdir = tmp_path_factory.mktemp("resume")
    rng = random.Random()
    stops = {"scr": rng.randrange(SAVE_FREQ, STEPS * EPOCHS),
             "tf": rng.randrange(1, STEPS * EPOCHS),
             # the dying save is the first at or after this batch: 10 or 15,
             # so the backup before it (5 or 10) is within an epoch
             "arr": rng.randrange(SAVE_FREQ + 1, 3 * SAVE_FREQ + 1)}
    proc = ddlrun(launcher, 3, workdir,
                  f"script:scr:stop={stops['scr']}+tfdata:tf:stop={stops['tf']}"
                  f"+arrays:arr:diewriting={stops['arr']}",
                  "copy:arr:arr-2a+copy:arr:arr-2b+copy:scr:scr-2a+copy:scr:scr-2b"
                  "+tfdata:tf-straight+arrays:arr-straight+tfdata:tf+arrays:arr")
    return workdir, stops, proc


@pytest.fixture(scope="module")
def two_ranks(launcher, three_ranks):
    """The 2-rank job: attempt 0 stops a tf.data fit and kills an arrays fit
    (rank 1, SIGKILL); attempt 1 runs straight and resumed fits, then resumes
    the 3-rank backups twice each."""
    workdir, _, first = three_ranks
    assert first.returncode == 0, output(first)
    rng = random.Random()
    stops = {"tf2": rng.randrange(1, STEPS * EPOCHS), "arr2": rng.randrange(1, STEPS * EPOCHS)}
    proc = ddlrun(launcher, 2, workdir,
                  f"tfdata:tf2:stop={stops['tf2']}+arrays:arr2:kill={stops['arr2']}",
                  "tfdata:tf2-straight+arrays:arr2-straight+tfdata:tf2+arrays:arr2:again"
                  "+arrays:arr-2a+arrays:arr-2b+script:scr-2a+script:scr-2b")
    return workdir, stops, proc


def epoch_digests(proc, job, reference):
    """Which epochs' end digests of `job` differ from `reference`'s, per rank
    (the resumed job prints only the epochs it trained; a later attempt's
    line replaces an earlier one's)."""
    def ends(name):
        pattern = rf"^RANK (\d) JOB {re.escape(name)} EPOCH (\d+) digest=(\w+)$"
        return {(int(r), int(e)): d for r, e, d in re.findall(pattern, proc.stdout, re.M)}

    mine, theirs = ends(job), ends(reference)
    differ = sorted(k for k in mine if mine[k] != theirs.get(k))
    return f"(rank, epoch) whose end differs from {reference}'s: {differ or 'none'}"


def test_killed_at_a_random_batch_resumes_bitwise_on_2_ranks(two_ranks):
    workdir, stops, proc = two_ranks
    note = f"(random batches {stops})"
    assert proc.returncode == 0, note + output(proc)
    assert re.search(rf"^RANK 1 JOB arr2 killed at batch {stops['arr2']}$", proc.stdout, re.M), \
        note
    assert re.search(r"^ddlrun: restart 1 of at most 1: attempt 1 failed \(exit code \d+\); "
                     r"rank 1 on \S+ ended first \(killed by SIGKILL\)", proc.stderr, re.M), \
        note + output(proc)
    for job, at in stops.items():
        # Attempt 0 started fresh; attempt 1 resumed from the last save.
        resumes = re.findall(rf"^RANK 0 JOB {job} RESTORED (.*)$", proc.stdout, re.M)
        assert resumes[0] == "epoch=0 step=0 iterations=0 world=2", note
        epoch, step, iterations = position_of(last_save(at))
        assert resumes[1] == f"epoch={epoch} step={step} iterations={iterations} world=2", \
            f"{job} {note}\n{output(proc)}"
        # The resumed attempt trains the straight run's rows at every step
        # from the backup on (its log's last lines, from the backup's step).
        for r in range(2):
            resumed = read_ids(workdir / f"{job}.ids.{r}")
            starts = [i for i, (s, _) in enumerate(resumed) if s == iterations]
            straight = [line for line in read_ids(workdir / f"{job}-straight.ids.{r}")
                        if line[0] >= iterations]
            assert resumed[starts[-1]:] == straight, f"{job} rank {r} {note}"
        assert final(proc, job, 2) == final(proc, f"{job}-straight", 2), \
            f"{job} {note}: the same rows, other weights; " + \
            epoch_digests(proc, job, f"{job}-straight")
    assert final(proc, "arr2", 2)[1] == str(STEPS * EPOCHS)


def test_killed_while_writing_resumes_bitwise_on_3_ranks(three_ranks):
    _, stops, proc = three_ranks
    note = f"(random batches {stops})"
    assert proc.returncode == 0, note + output(proc)
    assert "RANK 0 JOB arr killed while saving" in proc.stdout, note + output(proc)
    # The half-written backup is not read: the one before it is, then the
    # next save removes the partial directory.
    died = SAVE_FREQ * -(-stops["arr"] // SAVE_FREQ)
    resumes = re.findall(r"^RANK 0 JOB arr RESTORED (.*)$", proc.stdout, re.M)
    epoch, step, iterations = position_of(died - SAVE_FREQ)
    assert resumes[1] == f"epoch={epoch} step={step} iterations={iterations} world=3", \
        note + output(proc)
    assert re.search(rf"BackupAndRestore removes \S+/arr/\.partial-epoch-{died // STEPS:06d}-"
                     rf"step-{died % STEPS:09d}-\d+, left by an interrupted save", proc.stderr), \
        note + output(proc)
    for job in ("tf", "arr"):
        assert final(proc, job, 3) == final(proc, f"{job}-straight", 3), f"{job} {note}"


def read_ids(path):
    """[(step, [ids])] of one rank's log."""
    with open(path) as f:
        return [(int(line.split()[0]), [int(v) for v in line.split()[1:]]) for line in f]


def test_resumed_by_2_ranks_every_sample_of_the_interrupted_epoch_once(three_ranks,
                                                                      two_ranks):
    workdir, stops, _ = three_ranks
    _, _, proc = two_ranks
    note = f"(random batches of the 3-rank job {stops})"
    assert proc.returncode == 0, note + output(proc)
    assert re.search(r"the global batch of 9 rows does not divide over 2 ranks \(the "
                     r"backup's, written by 3 ranks\): rank 0 takes 5 rows of each step, the "
                     r"others 4", proc.stderr), note + output(proc)
    for kind, three_rank_job in (("arr", "arr"), ("scr", "scr")):
        a, b = restored(proc, f"{kind}-2a", 2), restored(proc, f"{kind}-2b", 2)
        assert a == b and a[3] == 3, f"{kind} {note}"
        epoch, step, iterations = a[:3]
        assert 0 < step < STEPS, f"{kind}: the backup is not within an epoch {note}"
        # The two 2-rank continuations of one backup are bitwise equal, and
        # train the same samples at the same steps.
        assert final(proc, f"{kind}-2a", 2, kind == "arr") == \
            final(proc, f"{kind}-2b", 2, kind == "arr"), f"{kind} {note}"
        logs_a = [read_ids(workdir / f"{kind}-2a.ids.{r}") for r in range(2)]
        logs_b = [read_ids(workdir / f"{kind}-2b.ids.{r}") for r in range(2)]
        assert logs_a == logs_b, f"{kind} {note}"
        # The interrupted epoch: its steps before the backup by 3 ranks (the
        # attempt that was interrupted), the rest by 2.
        before = [ids for r in range(3)
                  for s, ids in read_ids(workdir / f"{three_rank_job}.ids.{r}")
                  if epoch * STEPS <= s < iterations]
        after = [ids for r in range(2) for s, ids in logs_a[r] if s < (epoch + 1) * STEPS]
        assert sorted(sum(before + after, [])) == list(range(SAMPLES)), \
            f"{kind}: the interrupted epoch {epoch} (3 ranks to step {step}) {note}"
        assert [len(ids) for s, ids in logs_a[0]] == [5] * len(logs_a[0])  # rows 5 + 4
        # Each later epoch, at 2 ranks, takes every sample once too.
        for later in range(epoch + 1, EPOCHS):
            ids = [i for r in range(2) for s, v in logs_a[r] if s // STEPS == later for i in v]
            assert sorted(ids) == list(range(SAMPLES)), f"{kind} epoch {later} {note}"
