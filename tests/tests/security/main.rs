//! Security as processes: no secret in any log, file modes, hostile input and hostile objects.

mod host_file_keys;
mod hostile_input;
mod hostile_objects;
mod logs_and_modes;
