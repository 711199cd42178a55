"""Plans judged: ``score.py`` prices any plan, ``baselines.py`` builds the layouts people write by hand."""
