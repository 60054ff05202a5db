"""Writing the benchmarks' output files whole or not at all.

replace_atomically(path, write) calls write(temporary) on a temporary file
in path's folder and renames it over path only once write returned: rename
within one folder is atomic, so a full disk or a killed run leaves the
previous file as it was (and no temporary behind), and a reader never sees
half a file. The same rule as tp::write_file in common/src/util/file.cc.
"""
import os
import tempfile


def replace_atomically(path, write):
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    os.close(fd)
    try:
        write(temporary)
        os.chmod(temporary, 0o644)  # mkstemp makes 0600; results are for others to read
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_text(path, text):
    """replace_atomically for a text file."""
    def write(temporary):
        with open(temporary, "w") as f:
            f.write(text)
    replace_atomically(path, write)
