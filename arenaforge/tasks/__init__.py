"""Stage functions (typed records in, typed records and rejections out) and the model-access layer.

Never imports Prefect: `flows/` wraps these functions as tasks.
"""
