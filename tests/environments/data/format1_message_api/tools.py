from copy import deepcopy
from typing import Dict, List, Optional

DEFAULT_STATE = {"generated_ids": set(), "user_count": 2,
                 "user_map": {"alice": "USR001", "bob": "USR002"}, "inbox": [], "current_user": None}


class MessageAPI:
    """BFCL-style: no-argument constructor, state loaded from the scenario config."""

    def __init__(self):
        self.user_map: Dict[str, str] = {}
        self.inbox: List[Dict[str, str]] = []
        self.current_user: Optional[str] = None
        self._api_description = "messaging"

    def _load_scenario(self, scenario: dict, long_context: bool = False) -> None:
        state = deepcopy(DEFAULT_STATE)
        state.update(scenario)
        self.user_map = state["user_map"]
        self.inbox = state["inbox"]
        self.current_user = state["current_user"]

    def message_login(self, user_id: str) -> Dict[str, bool]:
        if user_id not in self.user_map.values():
            return {"login_status": False, "message": f"User ID '{user_id}' not found."}
        self.current_user = user_id
        return {"login_status": True, "message": f"User '{user_id}' logged in successfully."}

    def send_message(self, receiver_id: str, message: str) -> Dict[str, object]:
        if self.current_user is None:
            return {"error": "No user is currently logged in."}
        self.inbox.append({"sender": self.current_user, "receiver": receiver_id, "message": message})
        return {"sent_status": True, "message_count": len(self.inbox)}

    def view_messages_sent(self) -> Dict[str, List[str]]:
        return {"messages": [m["message"] for m in self.inbox if m["sender"] == self.current_user]}
