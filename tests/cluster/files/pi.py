"""Estimate pi by integrating 4/(1+x^2) over [0, 1], split across all MPI ranks."""
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
steps = 10_000_000
width = 1.0 / steps
partial = sum(4.0 / (1.0 + ((i + 0.5) * width) ** 2) for i in range(rank, steps, size)) * width
hosts = comm.gather(socket.gethostname(), root=0)
pi = comm.reduce(partial, op=MPI.SUM, root=0)
if rank == 0:
    print(f"pi ~= {pi:.12f} from {size} ranks on {len(set(hosts))} hosts: {sorted(set(hosts))}")
