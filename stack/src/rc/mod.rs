//! RoCEv2 Reliable Connected (RC) transport: the wire formats first (issue
//! 22). The queue pairs (requester, responder, completer) come on top of
//! [`wire`], sans-IO like TCP.

pub mod wire;
