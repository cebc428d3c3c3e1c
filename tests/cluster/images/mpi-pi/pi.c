/* pi by the midpoint rule over the ranks; each rank says where it ran. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size, length;
    char host[MPI_MAX_PROCESSOR_NAME];
    const long steps = 20000000;
    double width, sum = 0.0, pi = 0.0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &length);
    printf("rank %d of %d on %s\n", rank, size, host);
    width = 1.0 / steps;
    for (long i = rank; i < steps; i += size) {
        double x = width * (i + 0.5);
        sum += 4.0 / (1.0 + x * x);
    }
    MPI_Reduce(&sum, &pi, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("pi is approximately %.12f\n", pi * width);
    MPI_Finalize();
    return 0;
}
