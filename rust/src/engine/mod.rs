//! The discrete-event engine (`cais.engine`): the clock and event queue, trains,
//! channels with virtual channels and credits, what TB programs wait on (signals,
//! countdowns, byte bounds, processes) and an operation's completion. It names no
//! unit built on it: it tells them what happened through its seam ([`unit`]).

pub mod cell;
pub mod channel;
pub mod completion;
pub mod credits;
pub mod sim;
pub mod train;
pub mod unit;
pub mod wait;
pub mod yardstick;
