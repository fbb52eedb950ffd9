"""Runnable experiments for maskfit; not part of the installed package."""
