"""The server's shared singletons, one per process and shared by every visitor: the deployment
read from the environment, the loaded model and its forward-pass scheduler, the Class page's hall
and its follow endpoint, the board of speed measurements; and the process's C allocator settings.
"""

from ui import room_exports

__getattr__, __all__ = room_exports(__name__, {
    "allocator": ("settle_allocator",),
    "class_room": ("browser_key", "class_quiz", "current_hall", "store_problem", "wrong_codes"),
    "deployment": ("current_deployment", "downloadable", "downloadable_recording", "upload_problem"),
    "follow_endpoint": ("follow_address",),
    "measurement_board": ("REFRESH_AFTER_S",),
    "measurements": ("prefill_cost", "shared_board", "tokens_served"),
    "model": ("current_model", "current_scheduler", "current_source", "switch_model"),
})
