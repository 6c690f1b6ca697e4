/** Admin API: backend groups and their members. */
import type { AppContext } from '../context.ts';
import { queryInt } from './admin-accounts.handlers.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function adminGroupsHandlers(
  ctx: AppContext,
): Pick<HandlerMap, 'createGroup' | 'listGroups' | 'getGroup' | 'updateGroup' | 'listGroupMembers' | 'createGroupMember' | 'updateGroupMember' | 'deleteGroupMember'> {
  const { groups } = ctx.services.admin;
  return {
    async createGroup(req, res) {
      sendJson(res, 'createGroup', 201, await groups.create(req.body));
    },
    async listGroups(req, res) {
      sendJson(res, 'listGroups', 200, await groups.list({ limit: queryInt(req.query.limit), cursor: req.query.cursor }));
    },
    async getGroup(req, res) {
      sendJson(res, 'getGroup', 200, await groups.get(req.params.group_id));
    },
    async updateGroup(req, res) {
      sendJson(res, 'updateGroup', 200, await groups.update(req.params.group_id, req.body));
    },
    async listGroupMembers(req, res) {
      sendJson(res, 'listGroupMembers', 200, await groups.listMembers(req.params.group_id));
    },
    async createGroupMember(req, res) {
      sendJson(res, 'createGroupMember', 201, await groups.createMember(req.params.group_id, req.body));
    },
    async updateGroupMember(req, res) {
      sendJson(res, 'updateGroupMember', 200, await groups.updateMember(req.params.group_id, req.params.member_id, req.body));
    },
    async deleteGroupMember(req, res) {
      await groups.deleteMember(req.params.group_id, req.params.member_id);
      res.status(204).end();
    },
  };
}
