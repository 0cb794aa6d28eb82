"""Errors meant for users: each names the file, model or value at fault and the fix."""


class CagkitError(Exception):
    """A problem the user can fix; the CLI prints it on one line and exits non-zero."""


class DocumentError(CagkitError):
    """A document that cannot be read (binary, wrong encoding, unreadable, empty)."""


class StoreError(CagkitError):
    """A store that is missing, corrupted or built with other settings."""


class ModelError(CagkitError):
    """An unknown model name, or model files that are missing or corrupted."""


class TranslatorError(CagkitError):
    """A translator that is missing or was trained for other models."""


class SkippedDocumentWarning(UserWarning):
    """A document that ingest skipped; the message names it and the reason."""
