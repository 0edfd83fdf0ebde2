"""Streamlit view pieces shared by the pages. The engine does the work; this package shows it."""
