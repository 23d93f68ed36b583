"""Compiler passes, one pure function `Program -> Program` per module, run in order by `driver.PASSES`."""
