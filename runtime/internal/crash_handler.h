// A process that dies of a fatal signal says where, before it dies.
//
// install_crash_handler() arms handlers for SIGSEGV, SIGBUS, SIGFPE, SIGILL and
// SIGABRT (on an alternate stack for the calling thread, so a stack overflow
// there is reported too). On such a
// signal the handler writes to stderr — which a worker's log pipe forwards to the
// driver with the worker's prefix —
//
//   baton: fatal signal 11 (SIGSEGV), fault address 0x0, pid 4242 (CriticWorker:1); backtrace:
//     #0 0x55d0c... in baton::workers::export_hf_model(...) at workers/roles/role_model.cpp:215
//     #1 0x7f12a... in c10d::ProcessGroup::barrier(...) (libtorch_cpu.so+0x5a1c2f0)
//     ...
//
// then restores the default action and re-raises the signal, so the process
// still ends "killed by signal N" and its parent sees the same status as
// without the handler. Frames of the executable are symbolised with
// `addr2line` (function, file and line from the line tables of -g1 builds)
// when it is installed and answers within `BATON_BACKTRACE_TIMEOUT_MS`
// (default 1500); every other frame, and every frame when addr2line is absent
// or slow, with the dynamic symbol table (dladdr). BATON_BACKTRACE=0 leaves the
// signals alone.
//
// Thread safety: call once, early, before threads start (run_worker_host does).
// The handler itself uses only what a dying process can: write(2), fork/exec,
// dladdr and backtrace(3) (loaded at install time so that it does not
// allocate in the handler).
#pragma once

#include <string>

namespace baton {

// `label` names the process in the first line (e.g. "TestWorker:1").
void install_crash_handler(const std::string& label);

}  // namespace baton
