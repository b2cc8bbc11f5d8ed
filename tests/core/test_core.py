"""The C++ core on its own, without TensorFlow or MPI: small programs in
tests/core/ compiled against the core's sources. The algorithms,
negotiation and the node's shared-memory allreduce run with threads as
ranks (tests/core/in_process.h), so their edge cases take milliseconds
instead of an mpiexec launch each."""

import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS = os.path.join(REPO, "custom_ops")
CORE_TESTS = os.path.join(REPO, "tests", "core")

NEGOTIATION = ["negotiation/controller.cc", "negotiation/coordinator.cc",
               "negotiation/message.cc", "negotiation/response_cache.cc"]
ALGORITHMS = ["algorithms/allreduce.cc", "algorithms/chain_allreduce.cc", "algorithms/pairwise.cc",
              "algorithms/ring.cc", "topology/choose_allreduce.cc", "common/reduce_kernels.cc",
              "common/types.cc"]


WAIT = "transport/wait.cc"
FLAGS = ["-std=c++17", "-O2", "-pthread", f"-I{OPS}", f"-I{CORE_TESTS}"]


def compiler():
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        pytest.fail("no C++ compiler: the install step needs one too")
    return cxx


class CoreObjects:
    """The core's sources compiled once per test session (many checks link
    the same algorithms and engine files; compiling them once per check was
    most of this file's time), two at a time as the machine has two cores.
    ``flags``: the compiler's (test_core_sanitizers.py adds a sanitizer's)."""

    def __init__(self, directory, flags=FLAGS):
        self.directory = directory
        self.flags = flags
        self.objects = {}
        self.lock = threading.Lock()

    def _compile(self, source):
        obj = os.path.join(self.directory, source.replace("/", "_") + ".o")
        subprocess.run([compiler(), *self.flags, "-c", os.path.join(OPS, source), "-o", obj],
                       check=True, capture_output=True, text=True)
        return obj

    def get(self, sources):
        with self.lock:
            todo = [s for s in dict.fromkeys(sources) if s not in self.objects]
            with ThreadPoolExecutor(max_workers=2) as pool:
                for source, obj in zip(todo, pool.map(self._compile, todo)):
                    self.objects[source] = obj
            return [self.objects[s] for s in sources]


@pytest.fixture(scope="session")
def core_objects(tmp_path_factory):
    return CoreObjects(str(tmp_path_factory.mktemp("core_objects")))


_objects = None


@pytest.fixture(autouse=True)
def _share_core_objects(core_objects):
    global _objects
    _objects = core_objects


def build(program, sources, tmp_path, name="check"):
    """tests/core/`program` linked with the core's `sources` (and
    transport/wait.cc, which every wait of the core and of the harness,
    tests/core/in_process.h, goes through)."""
    if WAIT not in sources:
        sources = [*sources, WAIT]
    exe = tmp_path / name
    subprocess.run([compiler(), *FLAGS, os.path.join(CORE_TESTS, program),
                    *_objects.get(list(sources)), "-o", str(exe), "-lrt"],
                   check=True, capture_output=True, text=True)
    return exe


def build_and_run(program, sources, tmp_path, args=()):
    exe = build(program, sources, tmp_path)
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=240)


def assert_no_failures(proc, least=50):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 failures"), proc.stdout
    assert int(last.split()[0]) > least, last  # the checks ran


def test_float16_kernels_match_the_scalar_definition(tmp_path):
    proc = build_and_run("half_kernels.cc", ["common/reduce_kernels.cc", "common/types.cc"],
                         tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 mismatches" in proc.stdout, proc.stdout


def test_int16_uint16_and_bool_kernels_match_their_definition(tmp_path):
    proc = build_and_run("small_int_kernels.cc", ["common/reduce_kernels.cc", "common/types.cc"],
                         tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 mismatches" in proc.stdout, proc.stdout


def test_alltoall_on_threads_as_ranks(tmp_path):
    """1-5 ranks, random uneven splits with zeros, blocks of many chunks;
    no message above the limit, none empty, a bounded window in flight."""
    proc = build_and_run("alltoall_threads.cc", ["algorithms/alltoall.cc"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 mismatches" in proc.stdout, proc.stdout


def test_allreduce_algorithms_on_threads_as_ranks(tmp_path):
    """Direct exchange, pairwise + ring, the chain, the ring and both
    reduce-scatters, 1-6 ranks, empty and odd lengths, messages of 8 bytes up: rank-order
    bits where promised, identical bits on every rank."""
    assert_no_failures(build_and_run("algorithms_check.cc", ALGORITHMS, tmp_path))


def test_chain_allreduce_on_threads_as_ranks(tmp_path):
    """1-17 ranks, every dtype and op, empty and odd lengths, pieces of one
    element up: every rank's bits are the rank-order result (the same as
    the direct exchange's and the pairwise allreduce's); each rank sends
    only to its neighbours, the buffer once each way; a rank that never
    calls ends the others in the peer timeout; the rule that picks it."""
    assert_no_failures(build_and_run("chain_allreduce_check.cc", ALGORITHMS, tmp_path))


def test_negotiation_on_threads_as_ranks(tmp_path):
    """Out-of-order names, staggered offers, mismatches and a changed cached
    request refused on every rank in the same cycle, a tiny cache, a stall
    verdict naming the missing rank, shutdown seen by all."""
    proc = build_and_run("negotiation_check.cc",
                         [*NEGOTIATION, "common/types.cc"], tmp_path)
    assert_no_failures(proc)


def test_steady_cycle_through_node_shared_memory_on_threads_as_ranks(tmp_path):
    """The negotiation's cached cycle ANDed through a node's shared memory
    (transport/node_agreement.h): a hit costs no operation of the inner
    plane, a miss and evictions go by name and agree everywhere, a mismatch
    after 150 hits is refused on every rank naming the tensor, shapes and
    rank, a rank dying during cached cycles is named by the others' peer
    timeout, and word vectors too long for the slot go over the inner plane."""
    proc = build_and_run("steady_cycle_check.cc",
                         [*NEGOTIATION, "transport/node_agreement.cc", "transport/shm_arena.cc",
                          "transport/node_segment.cc", "common/types.cc"], tmp_path)
    assert_no_failures(proc)


def test_node_shared_memory_allreduce_on_threads_as_ranks(tmp_path):
    """1-3 nodes x 1-3 local ranks through real shared memory: fused odd
    tensors, one-page slots, node-then-cross summation order; and 1-3
    racks x 1-3 nodes x 1-2 local ranks with the rack allreduce as the
    cross step (local ranks, then nodes, then racks in order)."""
    proc = build_and_run("node_allreduce_check.cc",
                         ["algorithms/node_allreduce.cc", "algorithms/node_small_allreduce.cc",
                          "algorithms/rack_allreduce.cc",
                          "transport/shm_arena.cc", "transport/node_segment.cc", *ALGORITHMS],
                         tmp_path)
    assert_no_failures(proc)


def test_small_allreduce_steady_path_on_threads_as_ranks(tmp_path):
    """A 4 KB call on one node, general path and single pass alike,
    allocates nothing once warm (operator new counted per thread); the
    single pass gives the general path's bits (rank order, 2 and 3 ranks,
    Sum / Average / Max, odd lengths, the two paths alternating over a
    wrapping slot ring), and its wait names a rank that never comes."""
    proc = build_and_run("small_call_check.cc",
                         ["algorithms/node_allreduce.cc", "algorithms/node_small_allreduce.cc",
                          "algorithms/rack_allreduce.cc", "transport/shm_arena.cc",
                          "transport/node_segment.cc", *ALGORITHMS],
                         tmp_path)
    assert_no_failures(proc)


def test_rack_allreduce_on_threads_as_ranks(tmp_path):
    """1-3 racks x 1-3 nodes, odd lengths, pieces and messages of a few
    bytes up (a pipeline of many steps) to one piece: every rank's bits
    are each rack's nodes in node order, then the racks in rack order;
    with fp16 on the uplinks, that order with each rack partial and the
    result rounded to float16, half the bytes across racks."""
    proc = build_and_run("rack_allreduce_check.cc",
                         ["algorithms/rack_allreduce.cc", *ALGORITHMS], tmp_path)
    assert_no_failures(proc)


def test_topology_detection_and_agreement_on_threads_as_ranks(tmp_path):
    """DDL_TOPOLOGY and SLURM_TOPOLOGY_ADDR read from a given environment
    (malformed values named); 4-8 ranks agree on racks and nodes, or every
    rank gets the same error naming the ranks and what each saw; the
    probe's verdict from given rates (racks, one switch, unclear), the
    topology it makes, and every rank holding rank 0's verdict."""
    proc = build_and_run("topology_check.cc", ["topology/topology.cc",
                                               "topology/topology_probe.cc", "common/types.cc"],
                         tmp_path)
    assert_no_failures(proc)


def test_negotiation_cycle_operations_do_not_grow_with_ranks(tmp_path):
    """2-32 ranks, 1 and 200 tensors: a cached cycle is one AND of a few
    words and nothing else (log2(ranks) rounds on MPI); an uncached one adds
    one gather (every rank's names reach rank 0) and one broadcast. The
    same program prints the cost table up to 256 ranks (docs/topology.md)."""
    exe = build("negotiation_cost.cc", [*NEGOTIATION, "common/types.cc"], tmp_path, "cost")
    assert_no_failures(subprocess.run([str(exe), "--check"], capture_output=True, text=True,
                                      timeout=120))


def test_engine_thread_priority_as_proc_reports_it(tmp_path):
    """DDL_ENGINE_PRIORITY's effect on a thread: nice -10 with the privilege
    (run as root), a 100 us slice without it (after dropping root), nothing
    for normal; the thread is named ddl-engine."""
    proc = build_and_run("thread_priority_check.cc", ["engine/thread_priority.cc"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith(" 0 failures") and int(proc.stdout.split()[0]) >= 6, \
        proc.stdout


# The files that open MPI (the MPI transport, the world factory, and the runtime and C API
# that create it) are the only ones the harness leaves out.
OPENS_MPI = {"mpi_transport.cc", "mpi_world.cc", "world.cc", "runtime.cc", "c_api.cc"}


def engine_sources():
    """Every core source the engine needs on the threads-as-ranks harness:
    all of the core but the bindings and the files in OPENS_MPI (globbed, so
    a new file of the core is compiled here as it is in setup.py)."""
    found = []
    for folder in sorted(os.listdir(OPS)):
        path = os.path.join(OPS, folder)
        if not os.path.isdir(path) or folder == "bindings":
            continue
        found += [f"{folder}/{name}" for name in sorted(os.listdir(path))
                  if name.endswith(".cc") and name not in OPENS_MPI]
    return found


def test_engine_on_threads_as_ranks(tmp_path):
    """Whole Engines with threads as ranks: eager calls driving cycles while
    other threads enqueue; two process sets from one thread, and a call into
    one inside the other's cycle (only enqueued, owner kept); staggered
    joins; works taken by a cycle that throws are failed; shutdown in the
    middle of a cycle; the stall verdict; a silent rank (peer timeout); a
    rank 3 s late to a set-up step (the set-up group's split right after the
    settings are agreed, which waited without a timeout before; the
    node-group check): every other rank's set-up fails within 2.5 s; the
    node-group check failing on one node only (its ranks on two machines):
    every rank returns that error at once; rank 0 stuck opening
    DDL_AUTOTUNE_FILE (a FIFO) at the first allreduce: the others' call
    fails within 2.5 s; a wait's pause count past 2^31 (it still naps)."""
    exe = build("engine_check.cc", engine_sources(), tmp_path)
    # The checks that mostly wait (a rank seconds late, the peer timeout)
    # run in processes of their own beside the rest: 15 s in one, 5 s so.
    run_split(exe, ["late-split,silent", "late-node-check,late-table", "shm-negotiation"])


def run_split(exe, alone, least=50):
    """Runs `exe` once per group of check names in `alone` and once for the
    rest, all at once; each must pass, and together they run every check
    once. Returns their standard error, joined."""
    groups = [*alone, "-" + ",".join(alone)]
    procs = [subprocess.Popen([str(exe), g], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for g in groups]
    ran, stderr = [], ""
    for group, proc in zip(groups, procs):
        out, err = proc.communicate(timeout=240)
        stderr += err
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        assert_no_failures(done, least=0 if group != groups[-1] else least)
        names = [line.split(":")[0] for line in out.splitlines() if line.endswith(" s")]
        if group != groups[-1]:
            assert sorted(names) == sorted(group.split(",")), (group, out)
        ran += names
    assert len(ran) == len(set(ran)), ran
    return stderr


def test_engine_at_64_to_256_thread_ranks(tmp_path):
    """64, 128 and 256 thread-ranks in several rack x node x local shapes:
    three fused tensors of odd lengths per call, offered in a different
    order on each rank, bitwise the reference sum in the promised order on
    every rank. At 256 ranks, over tests/core/network.h's links: uplinks so
    slow that nothing completes for twice the peer timeout while bytes
    move, stalling together for longer than the judge's window but less
    than the timeout (every call succeeds, and the ranks say the transfer
    is slow but moving; a judge that took one quiet window for a hang
    failed it); one node's link silent (every rank ends its call with the
    report that a collective hangs, nothing moving); one rank's engine
    never started (every other rank names it in negotiation)."""
    exe = build("scale_check.cc", engine_sources(), tmp_path)
    # "slow" mostly waits on its slow links: beside the rest, 11 s, not 18 s.
    stderr = run_split(exe, ["slow"], least=10)
    assert "[keras_ddl] warning: slow transfer: nothing completed for" in stderr, stderr[-3000:]


def test_a_small_dev_shm_is_one_clear_error_on_every_rank(tmp_path):
    """/dev/shm a tmpfs of 12 MiB in a private mount namespace (as a
    container's): the node staging areas are committed at set-up, so the
    node that finds no room fails there, and every rank of the job gets the
    one error naming /dev/shm, the bytes needed and free, and the fixes;
    with DDL_SHM_ARENA_MB=2 the areas fit and an allreduce is right."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private /dev/shm needs root and unshare (util-linux)")
    exe = build("engine_check.cc", engine_sources(), tmp_path)
    proc = subprocess.run(["unshare", "-m", "sh", "-c",
                           f"mount -t tmpfs -o size=12m tmpfs /dev/shm && exec {exe} small-shm"],
                          capture_output=True, text=True, timeout=120)
    assert_no_failures(proc, least=35)


def test_process_set_setup_agreement_on_threads_as_ranks(tmp_path):
    """add_process_set's agreement through rank 0 (engine/set_setup.h): a
    rank that never calls is named on every other rank within the timeout
    (rank 0 missing: within twice it), differing lists and a build that
    fails on one rank are errors on every rank, a late caller reads the
    verdict at once."""
    proc = build_and_run("set_setup_check.cc", ["engine/set_setup.cc", "common/types.cc"],
                         tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 failures") and int(last.split()[0]) >= 35, proc.stdout


def test_autotune_on_threads_as_ranks(tmp_path):
    """DDL_AUTOTUNE with injected times: the slowest rank's median decides,
    rank 0's choice reaches every rank at the same batch, the algorithms'
    table is printed when they are chosen and the settings' when those are
    (a job cut short says how far it got), the table is saved, reused for
    the same job shape and refused for
    another; whole engines (flat, and 2 nodes x 2 local ranks) give every
    rank the same bits, the rank-order sum, through the switch."""
    assert_no_failures(build_and_run("autotune_check.cc", engine_sources(), tmp_path))


def test_probe_responder_answers_only_callers_with_the_job_secret(tmp_path):
    """transport/probe_responder.h on loopback: the job's secret gets the
    answer (also a byte at a time, and any of several admitted secrets); a
    wrong, short or missing secret, or 4 KiB of junk, reads zero bytes and
    the end of the stream (short or none: after the 0.5 s hold); the port
    listens on loopback and the interface addresses, never the wildcard;
    1000 idle connections (and 50 more per probe) leave 20 probes each
    answered within 0.5 s (half the shortest probe patience), the
    strangers having read nothing.
    DDL_JOB_SECRET's form: 32 hex digits, errors naming it without echoing it."""
    proc = build_and_run("probe_responder_check.cc",
                         ["transport/probe_responder.cc", "transport/probe_socket.cc",
                          "common/job_secret.cc", "common/types.cc"], tmp_path)
    assert_no_failures(proc, least=15)
