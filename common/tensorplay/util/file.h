// Writing the kit's output files (a demo's --json and --trace, a trace's
// Chrome JSON) so that a failure is never silent.
//
// Contract:
//   - write_file() creates or truncates the file, writes every byte, and
//     closes it, checking each step: a missing directory, a read-only file, a
//     full disk (which may show only at write or at close, as /dev/full does)
//     all throw tp::Error naming `what`, the path and the OS reason, e.g.
//     "cannot write the --json file '/dev/full': No space left on device".
//   - check_writable() is for output paths given on a command line: it throws
//     the same error before a long run if the file cannot be opened for
//     writing, and leaves an existing file as it was (a file it had to create
//     is removed again). A full disk can only show at write_file().
//   - Thread-compatible: no shared state.
#pragma once

#include <string>
#include <string_view>

namespace tp {

// what: how the message names the file, e.g. "the --json file".
void write_file(const std::string& path, std::string_view content, std::string_view what);
void check_writable(const std::string& path, std::string_view what);

}  // namespace tp
