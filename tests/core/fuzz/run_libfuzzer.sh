#!/bin/sh
# Runs one fuzz target (tests/core/fuzz/targets.h) under clang's libFuzzer
# with AddressSanitizer + UndefinedBehaviorSanitizer, from its corpus in
# the repository, for a given time; new inputs go to a scratch corpus.
#   tests/core/fuzz/run_libfuzzer.sh <target> [seconds, default 600]
# Every target, 10 minutes each, one at a time:
#   for t in negotiation_requests negotiation_responses ddl_settings settings_agreement \
#            probe_identities probe_answer autotune_table; do
#     nice -n 10 tests/core/fuzz/run_libfuzzer.sh $t 600 || break; done
set -eu
target=$1
seconds=${2:-600}
here=$(cd "$(dirname "$0")" && pwd)
ops=$here/../../../custom_ops
work=${TMPDIR:-/tmp}/ddl_fuzz_$target
mkdir -p "$work/corpus"
clang++ -std=c++17 -O1 -g -pthread -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined -DDDL_FUZZ_TARGET="\"$target\"" -I"$ops" -I"$here" \
  "$here/libfuzzer_main.cc" "$here/targets.cc" "$ops/negotiation/message.cc" \
  "$ops/common/types.cc" "$ops/common/config.cc" "$ops/common/job_secret.cc" \
  "$ops/health/probe_wire.cc" "$ops/tuning/autotune.cc" "$ops/tuning/autotune_settings.cc" \
  -o "$work/fuzz"
# -malloc_limit_mb: an allocation the bytes (at most 64 KiB) cannot justify
# is a finding; -timeout: an input that takes 5 s is one too (not 1 s: a busy machine
# stalls an input that long).
cd "$work"
exec ./fuzz -max_total_time="$seconds" -max_len=65536 -malloc_limit_mb=64 -rss_limit_mb=2048 \
  -timeout=5 -print_final_stats=1 "$work/corpus" "$here/../fuzz_corpus/$target"
