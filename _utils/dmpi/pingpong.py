"""A TCP ping-pong: one side echoes each message back whole, the other times round
trips of 1-byte messages (latency) and of large ones (bandwidth).

The network self-test (:mod:`dmpi.master.selftest`) runs it twice for every pair of
nodes: between the nodes' hosts (``mpi_network.pingpong`` on the minions) and between
two ranks of a job, in the job's own network namespaces. Inside the job the image has
nothing of DockerMPI, so this module's source is sent as part of the job's program: it
imports the standard library only.

:func:`mpi_pingpong` times the same two figures over MPI between two ranks (the job
passes mpi4py in, so this module still needs nothing else); the data-path benchmark
(``bench/datapath.py``) sends this source into its jobs too.

The wire: each message is an 8-byte big-endian length, then that many bytes; the echo
sends the bytes back without the length.
"""

import socket
import struct
import time

HEADER = struct.Struct("!Q")


def _fill(sock, view):
    """Receive exactly ``len(view)`` bytes into ``view``."""
    got = 0
    while got < len(view):
        count = sock.recv_into(view[got:])
        if count == 0:
            raise ConnectionError("the peer closed the connection mid-message")
        got += count


def listen(address, port, timeout):
    """A listening socket on ``address:port`` (TIME_WAIT of an earlier test does not
    keep it), accepting within ``timeout`` seconds."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(1)
    listener.settimeout(timeout)
    return listener


def echo(listener, max_bytes, timeout):
    """Accept one connection on ``listener`` and send every message back until the
    peer closes; a message longer than ``max_bytes`` ends it. Returns the messages
    echoed."""
    conn, _ = listener.accept()
    echoed = 0
    with conn:
        conn.settimeout(timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        header = bytearray(HEADER.size)
        buffer = memoryview(bytearray(max_bytes))
        while True:
            try:
                _fill(conn, memoryview(header))
            except ConnectionError:
                return echoed
            (length,) = HEADER.unpack(header)
            if length > max_bytes:
                raise ValueError(f"a message of {length} bytes, more than {max_bytes}")
            _fill(conn, buffer[:length])
            conn.sendall(buffer[:length])
            echoed += 1


def connect(address, port, timeout):
    """A connection to the echo at ``address:port``, retried until it listens or
    ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=timeout)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def measure(sock, size, lat_iters, bw_iters):
    """Round trips to the echo: ``{"latency_us": half a 1-byte round trip,
    "bandwidth_mb_per_s": bytes one way per second of half a round trip of ``size``
    bytes (10^6 bytes)}``, each after a tenth as many round trips for warm-up."""
    def rounds(length, iters):
        message = HEADER.pack(length) + bytes(length)
        back = memoryview(bytearray(length))
        warmup = max(2, iters // 10)
        for i in range(warmup + iters):
            if i == warmup:
                start = time.perf_counter()
            sock.sendall(message)
            _fill(sock, back)
        return time.perf_counter() - start

    latency = rounds(1, lat_iters)
    bandwidth = rounds(size, bw_iters)
    return {"latency_us": latency / lat_iters / 2 * 1e6,
            "bandwidth_mb_per_s": 2 * bw_iters * size / bandwidth / 1e6}


def mpi_pingpong(comm, MPI, size, lat_iters, bw_iters):
    """Ranks 0 and 1 of ``comm`` ping-pong with mpi4py's blocking ``Send``/``Recv``
    (``MPI`` is mpi4py's module): the figures :func:`measure` gives, as rank 0 and
    rank 1 each timed them, after a barrier and a tenth as many warm-up round trips."""
    rank = comm.Get_rank()

    def rounds(length, iters):
        buf = bytearray(length)
        warmup = max(2, iters // 10)
        for i in range(warmup + iters):
            if i == warmup:
                comm.Barrier()
                start = MPI.Wtime()
            if rank == 0:
                comm.Send([buf, MPI.BYTE], dest=1, tag=7)
                comm.Recv([buf, MPI.BYTE], source=1, tag=7)
            else:
                comm.Recv([buf, MPI.BYTE], source=0, tag=7)
                comm.Send([buf, MPI.BYTE], dest=0, tag=7)
        return MPI.Wtime() - start

    latency = rounds(1, lat_iters)
    bandwidth = rounds(size, bw_iters)
    return {"latency_us": latency / lat_iters / 2 * 1e6,
            "bandwidth_mb_per_s": 2 * bw_iters * size / bandwidth / 1e6}
