"""Plain log lines for the project's own loggers, in local runs and in pods alike."""

import logging


def setup_logging() -> None:
    logger = logging.getLogger("tasks")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
