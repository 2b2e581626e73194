"""fault_job.py has no `__main__` guard on purpose (it is what worker processes must
survive): pytest's doctest collection must not import it."""

collect_ignore = ["fault_job.py"]
