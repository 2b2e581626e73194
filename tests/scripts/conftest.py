"""fault_job.py and exit_job.py have no `__main__` guard on purpose (they are scripts
as users write them, which worker processes and interpreter exits must survive):
pytest's doctest collection must not import them."""

collect_ignore = ["fault_job.py", "exit_job.py"]
