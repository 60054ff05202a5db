// Writing the kit's output files (a demo's --json and --trace, a trace's
// Chrome JSON) so that a failure is never silent.
//
// Contract:
//   - write_file() writes every byte and closes the file, checking each
//     step: a missing directory, a read-only folder, a full disk (which may
//     show only at write or at close, as /dev/full does) all throw tp::Error
//     naming `what`, the path and the OS reason, e.g. "cannot write the
//     --json file '/dev/full': No space left on device".
//   - A regular file (new, or one that exists) is replaced whole or not at
//     all: the content goes to a temporary file in the same folder
//     (".NAME.XXXXXX"), which is renamed over the path only once complete,
//     so a full disk or a killed run leaves the previous file as it was and
//     no temporary file behind; a reader never sees half a file. A symlink
//     is followed (its target is replaced, the link stays). Anything else
//     that exists at the path (a device such as /dev/full, a FIFO) is written
//     in place, as it cannot be replaced. The new file is mode 0644.
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
