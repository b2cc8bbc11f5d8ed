// The job's secret: 16 random bytes that only the job's own processes
// know, which a caller must send before a probe responder
// (transport/probe_responder.h) says anything.
//
// Rank 0 of each group draws one at set-up (or takes DDL_JOB_SECRET, which
// ddlrun may set for the whole job) and the group's broadcast gives it to
// every rank: nothing outside the job sees it unless it can read the job's
// control-plane traffic or environment.
#pragma once

#include <cstddef>
#include <string>

#include "types.h"

namespace ddl {

constexpr size_t kJobSecretBytes = 16;

// DDL_JOB_SECRET's text (32 hexadecimal digits, either case) as its 16
// bytes in `out`; any other text is an error naming the variable.
Status ParseJobSecret(const std::string& text, std::string* out);

// 16 fresh bytes from the kernel's random source (/dev/urandom, else
// std::random_device).
std::string DrawJobSecret();

// Equal, in a time that does not depend on where the first difference is
// (a stranger cannot guess the secret byte by byte from answer times).
bool SameJobSecret(const std::string& a, const std::string& b);

}  // namespace ddl
