"""Students' code for the checker's tests: one right answer, and wrong ones with one known mistake each."""
