import os

from kernelbay import register_model

SETTING = os.no_such_function()
