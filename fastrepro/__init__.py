__version__ = "0.1.0"

def selftest(**kwargs):
    "Check fastrepro's guarantees on this installation and hardware (`fastrepro.check.proof.selftest`); its `Selftest`"
    from .check.proof import selftest as run  # imports fastai: only when called
    return run(**kwargs)
