"""A FUSE file system whose one file never answers a read: a process that reads it sleeps in the
kernel, and once a signal has interrupted the read it sleeps uninterruptibly (state D) until this
server answers or goes away. It is what a hung NFS or GPU driver does to a worker, on demand.

The kernel's FUSE protocol is spoken directly on /dev/fuse (no libfuse): INIT, LOOKUP and GETATTR of
/stuck, OPEN (direct I/O, so each read reaches the server), and READ, which is never answered;
INTERRUPT is ignored, as a server may. Ending this process (any signal) closes /dev/fuse, which
aborts the connection: the reader's read fails with ENOTCONN and a pending SIGKILL ends it.

usage: stuck_fuse.py MOUNTPOINT READ_MARKER
  prints "mounted" once the file system is up; creates READ_MARKER when the first read arrives.
  Exits 77 when FUSE cannot be mounted here (no /dev/fuse, not root, no mount permission).
"""
import ctypes
import ctypes.util
import os
import stat
import struct
import sys

FUSE_LOOKUP, FUSE_GETATTR, FUSE_OPEN, FUSE_READ, FUSE_RELEASE = 1, 3, 14, 15, 18
FUSE_INIT, FUSE_OPENDIR, FUSE_RELEASEDIR, FUSE_INTERRUPT, FUSE_DESTROY = 26, 27, 29, 36, 38
FOPEN_DIRECT_IO = 1
ENOENT, ENOSYS = 2, 38
ROOT, FILE = 1, 2
IN_HEADER = struct.Struct("=IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
OUT_HEADER = struct.Struct("=IiQ")      # len, error, unique


def attr(node):
    """struct fuse_attr: ino, size, blocks, atime, mtime, ctime, their nsecs, mode, nlink, uid, gid,
    rdev, blksize, flags."""
    mode = (stat.S_IFDIR | 0o755) if node == ROOT else (stat.S_IFREG | 0o444)
    size = 0 if node == ROOT else 4096
    return struct.pack("=QQQQQQIIIIIIIIII", node, size, 8, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def reply(fd, unique, body=b"", error=0):
    os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique) + body)


def mount(mountpoint):
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as e:
        print(f"stuck_fuse: cannot open /dev/fuse: {e}", file=sys.stderr)
        sys.exit(77)
    options = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}".encode()
    if libc.mount(b"ddprun-stuck", mountpoint.encode(), b"fuse", 0x2 | 0x4, options) != 0:  # nosuid, nodev
        print(f"stuck_fuse: mount: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        sys.exit(77)
    return fd


def serve(fd, marker):
    while True:
        try:
            request = os.read(fd, 1 << 20)
        except InterruptedError:
            continue
        except OSError as e:
            if e.errno == 19:  # ENODEV: unmounted
                return
            raise
        length, opcode, unique, node, *_ = IN_HEADER.unpack_from(request)
        body = request[IN_HEADER.size:length]
        if opcode == FUSE_INIT:
            major, minor, readahead, flags = struct.unpack_from("=IIII", body)
            # fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold,
            # max_write, time_gran, max_pages, map_alignment, flags2, unused[7].
            reply(fd, unique, struct.pack("=IIIIHHIIHHI7I", 7, min(minor, 31), readahead, 0, 16, 12, 4096, 1, 1, 0,
                                          0, *([0] * 7)))
        elif opcode == FUSE_LOOKUP:
            if node == ROOT and body.rstrip(b"\0") == b"stuck":
                # fuse_entry_out: nodeid, generation, entry_valid, attr_valid, their nsecs, attr.
                reply(fd, unique, struct.pack("=QQQQII", FILE, 0, 60, 60, 0, 0) + attr(FILE))
            else:
                reply(fd, unique, error=ENOENT)
        elif opcode == FUSE_GETATTR:
            reply(fd, unique, struct.pack("=QII", 60, 0, 0) + attr(node))  # fuse_attr_out
        elif opcode in (FUSE_OPEN, FUSE_OPENDIR):
            reply(fd, unique, struct.pack("=QII", 0, FOPEN_DIRECT_IO if opcode == FUSE_OPEN else 0, 0))
        elif opcode == FUSE_READ:
            if node == FILE:
                with open(marker, "w") as f:
                    f.write(f"{unique}\n")
                continue  # never answered
            reply(fd, unique, error=ENOSYS)
        elif opcode in (FUSE_INTERRUPT, FUSE_RELEASE, FUSE_RELEASEDIR):
            if opcode != FUSE_INTERRUPT:
                reply(fd, unique)
        elif opcode == FUSE_DESTROY:
            return
        else:
            reply(fd, unique, error=ENOSYS)


def main():
    mountpoint, marker = sys.argv[1], sys.argv[2]
    fd = mount(mountpoint)
    print("mounted", flush=True)
    serve(fd, marker)


if __name__ == "__main__":
    main()
