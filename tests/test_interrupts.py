"""Ctrl-C while a reply streams: a flag the generation reads, not an exception thrown into whatever runs."""

import os
import signal

import pytest

from specrun.cli.interrupts import CtrlC


def test_the_first_ctrl_c_is_a_flag_and_the_second_interrupts():
    with CtrlC() as ctrl_c:
        assert not ctrl_c.pressed()
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs before the next line
        assert ctrl_c.pressed()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_leaving_restores_the_handler_it_found():
    with CtrlC():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
