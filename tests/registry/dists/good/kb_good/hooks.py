from kernelbay.hooks import hookimpl


def no_beams(options):
    return ["good: beam search is not supported"] if options.get("beam_width", 1) > 1 else []


@hookimpl
def register_fixture_rules(register):
    register(no_beams)
