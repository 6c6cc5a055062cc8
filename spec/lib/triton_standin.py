"""A stand-in for Triton's FileCacheManager (triton/runtime/cache.py), the
code path a model server takes on every kernel it looks up, for tests and
benchmarks of a mounted cache."""
import os
import uuid


def lookup(mount, key, filename, data=b"compiled on a miss"):
    """Look up kernel KEY's FILENAME with TRITON_CACHE_DIR=<mount>/io.triton.cache
    as Triton does: makedirs of the key directory on every lookup (also on a
    hit); on a miss put(): a tmp.pid_<pid>_<uuid> directory beside the file,
    the file written there, os.replace()d into place, the temporary directory
    removedirs'd. Returns ("hit", bytes), ("stored", bytes) or ("error", errno)."""
    cache_dir = os.path.join(mount, "io.triton.cache", key)
    try:
        os.makedirs(cache_dir, exist_ok=True)
        path = os.path.join(cache_dir, filename)
        if os.path.exists(path):
            with open(path, "rb") as fh:
                return ("hit", fh.read())
        tmp_dir = os.path.join(cache_dir, "tmp.pid_%d_%s" % (os.getpid(), uuid.uuid4().hex))
        os.makedirs(tmp_dir, exist_ok=True)
        with open(os.path.join(tmp_dir, filename), "wb") as fh:
            fh.write(data)
        os.replace(os.path.join(tmp_dir, filename), path)
        os.removedirs(tmp_dir)
        with open(path, "rb") as fh:
            return ("stored", fh.read())
    except OSError as err:
        return ("error", err.errno)
