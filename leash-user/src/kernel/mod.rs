//! The kernel side, seen from user space: load and attach the programs, and typed views of their
//! maps. [`Tracker`] writes them (register trees, kill, release); [`TrackerView`] reads them
//! (members, counters), from any thread.

mod attach;
pub mod btf;
pub mod descent;
mod error;
mod hosts;
mod index;
mod kfunc;
mod kill;
mod link;
mod load;
mod maps;
mod marks;
mod pin_lock;
mod pins;
pub mod programs;
pub mod ptrace_guard;
mod raw;
mod record;
mod register;
mod skips;
pub mod support;
mod tracker;
mod types;
mod view;
pub mod whois;

pub use descent::Descent;
pub use error::{Error, IdentifyError};
pub use kill::{KILL_ROUNDS_TIMEOUT, Kill, KillError, KillReport, KillStep, SIGNALS_PER_STEP};
pub use marks::Membership;
pub use pin_lock::{Holder, PinLock, PinsHeld};
pub use pins::Pins;
pub use programs::{AttachPoint, Layer, Program};
pub use ptrace_guard::{Guard, GuardChoice};
pub use record::TreeEvent;
pub use register::{Adoption, SeedStep, identify, identify_pidfd};
pub use skips::ProgramSkips;
pub use tracker::Tracker;
pub use types::{Capacity, MemberInfo, Origin, Stats, TreeStatus};
pub use view::{TrackerView, fill_comms};
pub use whois::{Identity, UserNamespace, Whois};
