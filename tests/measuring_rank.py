"""A rank of a CPU rank pool that answers measuring jobs with a test's own backend: the loop
the tests that drive ``measure_problem`` through a custom backend share."""


def serve_measure_jobs(backend, conn) -> None:
    """Answer each (tag, job) from ``conn`` with ``measure_problem`` on ``backend`` (rank 0
    sends the result) until the pool sends None, then close the backend."""
    from ficco.execute.measure import measure_problem

    while (message := conn.recv()) is not None:
        tag, job = message
        out = measure_problem(backend, job.problem, job.schedules, 0, job.timing, lambda m: None)
        if backend.rank == 0:
            conn.send(("done", tag, out))
    backend.close()
