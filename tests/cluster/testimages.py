"""The test images that the flavour and MPI Operator tests push to the test cluster: one
list each, built when missing, and built beforehand in the background.

Built from scratch they take minutes (a debootstrapped bullseye, Intel MPI and MPICH from
Debian's mirror), which the tests that need them would wait for. A session that builds
the cluster builds them next, in the background (tests/conftest.py), at a low CPU weight
while the first integration tests run; the tests' own calls then find them built
(``TestCluster.build_image`` builds a tag once, under a lock, so a test that comes
first waits for the build under way rather than making a second).
"""

import time

from tests.background import Background
from tests.cluster.testcluster import TestCluster, step

#: The builds' CPU weight (Docker's default is 1024): they take what the tests leave idle.
CPU_SHARES = 128


def flavours(cluster):
    """{short name: tag} of the MPI flavours' images (tests/integration/test_flavours.py)."""
    return {"bullseye": cluster.mpi_bullseye_image(),
            "openmpi5": cluster.mpi_openmpi5_image(),
            "mpich": cluster.mpi_mpich_image(),
            "intelmpi": cluster.mpi_intelmpi_image()}


def pi_examples(cluster):
    """{short name: tag} of the MPI Operator's pi examples (tests/integration/test_mpijob.py)."""
    return {"mpi-pi": cluster.mpi_pi_image(),
            "mpi-pi-mpich": cluster.mpi_pi_hydra_image(cluster.notebook_mpich_image()),
            "mpi-pi-intel": cluster.mpi_pi_hydra_image(cluster.mpi_intelmpi_image())}


class Prebuild(Background):
    """Every image of :func:`flavours` and :func:`pi_examples`, built at ``CPU_SHARES``;
    ``result()`` is their tags. Nothing waits for it: a failed build here is made again,
    and reported, by the test that needs the image."""

    name = "test-images"

    def run(self):
        started = time.monotonic()
        cluster = TestCluster(build_cpu_shares=CPU_SHARES)
        try:
            built = {**flavours(cluster), **pi_examples(cluster)}
        except Exception as exc:
            step(f"building the test images beforehand failed ({type(exc).__name__}: "
                 f"{exc}); the tests that need them build them")
            raise
        step(f"test images ready in {time.monotonic() - started:.0f}s")
        return built


PREBUILD = Prebuild()
