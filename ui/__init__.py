"""Streamlit view pieces shared by the pages. The engine does the work; this package shows it.

The app's server runs the model beside the visitors' browsers, on as few as 2 cores. torch's
OpenMP threads normally spin for a while after each parallel region, holding a core the server's
event loop and a local browser need: a decode step's forward pass took 91-122 ms inside the
server during a Step click, against 56 ms alone. Told to sleep instead ("passive"), they took
55-78 ms in the server and cost 1-2 ms alone. OpenMP reads this once, when torch loads; app.py
imports this package before anything imports torch. (A server whose first visitor opens a page's
own link runs that page, which loads torch first: `make run` sets the variable itself.) An
explicit setting is left alone, and none is made once torch has loaded: the exact rows kernel
reads the variable to know whether OpenMP's threads sleep (engine/fast/exact_rows_kernel.cpp), so
it must say what OpenMP read.
"""

import os
import sys

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
