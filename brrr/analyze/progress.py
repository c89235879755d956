"""A progress bar over named steps, shared by the analyzer's stages (capture -> ... -> report) and by
`--verify`'s remedies: each call names the step that starts now and completes the one before."""

from contextlib import contextmanager


@contextmanager
def step_bar(enabled, title, total, done=0):
    """Yields `start(name)`: a transient rich bar of `total` steps (`done` of them finished already) whose
    description becomes `title: name`; a no-op when not enabled. The last step completes on exit."""
    if not enabled:
        yield lambda name: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(title, total=total, completed=done)
        started = [False]

        def start(name):
            if started[0]:
                bar.advance(task)
            started[0] = True
            bar.update(task, description=f"{title}: {name}")

        yield start
        bar.advance(task)
