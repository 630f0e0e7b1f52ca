// The public surface of baton's runtime: include this in driver programs.
#pragma once

#include "base/errors.h"        // IWYU pragma: export
#include "runtime/call_args.h"     // IWYU pragma: export
#include "runtime/future.h"        // IWYU pragma: export
#include "runtime/method_table.h"  // IWYU pragma: export
#include "runtime/resource_pool.h" // IWYU pragma: export
#include "runtime/role_set.h"      // IWYU pragma: export
#include "runtime/runtime.h"       // IWYU pragma: export
#include "runtime/shared_tensor.h" // IWYU pragma: export
#include "runtime/value.h"         // IWYU pragma: export
#include "runtime/worker.h"        // IWYU pragma: export
#include "runtime/worker_group.h"  // IWYU pragma: export
